//! OpenAPI (`utoipa` feature): describe the layer in your API's document.
//!
//! [`IdempotencyDoc`] is a [`utoipa::Modify`]: it adds, to every operation it covers, the
//! `Idempotency-Key` header parameter (required, 1 to 255 visible ASCII characters) and the
//! answers the layer gives itself (400, 408, 409 with `Retry-After`, 413, 422, 500, 503 with
//! `Retry-After`), each `application/problem+json` with the schema `IdempotencyProblem`. An answer
//! the operation already documents (its own 400 for invalid input, say) is kept, its description
//! extended with the layer's reasons. Every success answer (2xx) of the operation gains the
//! headers a replay adds: `Idempotent-Replayed` and `Idempotent-Body-Not-Kept`.
//!
//! Describe the layer as you configured it: a layer built with
//! [`with_header_name`](crate::Idempotency::with_header_name),
//! [`optional`](crate::Idempotency::optional) or
//! [`with_replay_header`](crate::Idempotency::with_replay_header) needs the same
//! [`with_key_header`](IdempotencyDoc::with_key_header), [`optional`](IdempotencyDoc::optional) or
//! [`with_replay_header`](IdempotencyDoc::with_replay_header) here, or the document is untrue.
//!
//! ```
//! use utoipa::OpenApi;
//! use tower_idempotency::openapi::IdempotencyDoc;
//!
//! #[utoipa::path(post, path = "/orders", responses((status = 201, description = "Created")))]
//! #[allow(dead_code)]
//! fn create_order() {}
//!
//! // Every POST and PATCH operation (or `IdempotencyDoc::paths(&["/orders"])`).
//! const IDEMPOTENCY: IdempotencyDoc = IdempotencyDoc::COVERED_METHODS;
//!
//! #[derive(OpenApi)]
//! #[openapi(paths(create_order), modifiers(&IDEMPOTENCY))]
//! struct ApiDoc;
//!
//! let doc = ApiDoc::openapi();
//! let post = doc.paths.paths["/orders"].post.as_ref().unwrap();
//! for status in ["201", "400", "408", "409", "413", "422", "500", "503"] {
//!     assert!(post.responses.responses.contains_key(status), "{status}");
//! }
//! let key = &post.parameters.as_ref().unwrap()[0];
//! assert_eq!(key.name, "Idempotency-Key");
//! ```

use utoipa::openapi::{
    header::HeaderBuilder,
    path::{Operation, Parameter, ParameterBuilder, ParameterIn},
    schema::{ObjectBuilder, Schema, Type},
    ContentBuilder, OpenApi, Ref, RefOr, Required, Response, ResponseBuilder,
};

/// The name of the problem document's schema in `components.schemas`.
pub const PROBLEM_SCHEMA: &str = "IdempotencyProblem";

/// The key's syntax as a JSON Schema pattern: the bare form, 1 to 255 visible ASCII characters,
/// not starting with a quote (a leading `"` opens the quoted form, also accepted by the layer).
pub const KEY_PATTERN: &str = "^[!#-~][!-~]{0,254}$";

/// Which operations of the document the layer guards.
#[derive(Debug, Clone, Copy)]
pub enum Operations {
    /// Every POST and PATCH operation: the layer's default methods.
    CoveredMethods,
    /// The operations of these paths (every method the layer covers by default on them).
    Paths(&'static [&'static str]),
}

/// A [`utoipa::Modify`] that documents the layer on the operations it guards.
///
/// Use [`IdempotencyDoc::COVERED_METHODS`] for every POST and PATCH operation, or
/// [`IdempotencyDoc::paths`] for some paths only. Describe the routes as the layer guards them:
/// an operation not behind the layer should not be covered.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyDoc {
    operations: Operations,
    key_header: &'static str,
    replay_header: &'static str,
    key_required: bool,
}

impl IdempotencyDoc {
    /// Every POST and PATCH operation.
    pub const COVERED_METHODS: IdempotencyDoc = IdempotencyDoc {
        operations: Operations::CoveredMethods,
        key_header: "Idempotency-Key",
        replay_header: "Idempotent-Replayed",
        key_required: true,
    };

    /// The key header's name, for a layer built with
    /// [`with_header_name`](crate::Idempotency::with_header_name).
    ///
    /// ```
    /// use tower_idempotency::openapi::IdempotencyDoc;
    /// const DOC: IdempotencyDoc = IdempotencyDoc::COVERED_METHODS.with_key_header("X-Request-Key");
    /// # let _ = DOC;
    /// ```
    pub const fn with_key_header(mut self, name: &'static str) -> Self {
        self.key_header = name;
        self
    }

    /// The replay marker's name, for a layer built with
    /// [`with_replay_header`](crate::Idempotency::with_replay_header).
    pub const fn with_replay_header(mut self, name: &'static str) -> Self {
        self.replay_header = name;
        self
    }

    /// The key header is optional, for an [`optional`](crate::Idempotency::optional) layer.
    pub const fn optional(mut self) -> Self {
        self.key_required = false;
        self
    }

    /// The POST and PATCH operations of `paths` only (`"/orders"`, as the document spells them).
    ///
    /// ```
    /// use tower_idempotency::openapi::IdempotencyDoc;
    /// const ORDERS: IdempotencyDoc = IdempotencyDoc::paths(&["/orders"]);
    /// # let _ = ORDERS;
    /// ```
    pub const fn paths(paths: &'static [&'static str]) -> Self {
        Self {
            operations: Operations::Paths(paths),
            ..Self::COVERED_METHODS
        }
    }

    /// Add the header parameter and the layer's answers to one operation, as the default layer
    /// gives them ([`COVERED_METHODS`](Self::COVERED_METHODS)'s settings).
    pub fn document(operation: &mut Operation) {
        Self::COVERED_METHODS.document_operation(operation);
    }

    /// Add the header parameter and the layer's answers to one operation, with these settings.
    pub fn document_operation(&self, operation: &mut Operation) {
        let parameters = operation.parameters.get_or_insert_with(Vec::new);
        parameters.retain(|p| !p.name.eq_ignore_ascii_case(self.key_header));
        parameters.push(self.key_parameter());
        for (status, response) in operation.responses.responses.iter_mut() {
            if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
                self.replay_headers(response);
            }
        }
        for (status, description, retry_after) in ANSWERS {
            let responses = &mut operation.responses.responses;
            match responses.get_mut(*status) {
                Some(RefOr::T(existing)) => {
                    existing.description = format!(
                        "{}; or, from the idempotency layer: {description}",
                        existing.description
                    );
                    if *retry_after {
                        existing
                            .headers
                            .insert("Retry-After".to_owned(), retry_after_header());
                    }
                }
                Some(RefOr::Ref(_)) => {}
                None => {
                    responses.insert(
                        (*status).to_owned(),
                        RefOr::T(problem_response(description, *retry_after)),
                    );
                }
            }
        }
    }
}

/// The layer's own answers: status, why, whether it carries `Retry-After`.
const ANSWERS: &[(&str, &str, bool)] = &[
    ("400", "the `Idempotency-Key` header is missing or invalid (or the caller is not identified, with `require_scope`); nothing was done", false),
    ("408", "the request body did not arrive in time; nothing was done, send it again with the same key", false),
    ("409", "a request with this `Idempotency-Key` is still being processed; retry after `Retry-After` seconds with the same key to get its answer", true),
    ("413", "the request body is over the limit; nothing was done", false),
    ("422", "this `Idempotency-Key` was first used for a different request (method, path and query, body); use a new key for a new operation, or resend the original unchanged", false),
    ("500", "the idempotency store answered with an error a retry will not cure; nothing was done", false),
    ("503", "the idempotency store is unavailable; nothing was done (or, with the problem type `CommitUnconfirmed`, the commit broke off and may have landed); retry after `Retry-After` seconds with the same key", true),
];

impl IdempotencyDoc {
    fn key_parameter(&self) -> Parameter {
        let required = if self.key_required {
            Required::True
        } else {
            Required::False
        };
        ParameterBuilder::new()
            .name(self.key_header)
            .parameter_in(ParameterIn::Header)
            .required(required)
            .description(Some(format!(
                "One unique key per operation (a UUID, for example), sent again unchanged on every retry of it. A retry of a finished request gets the first answer back, with `{}: true`.",
                self.replay_header
            )))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .max_length(Some(255))
                    .pattern(Some(KEY_PATTERN)),
            ))
            .build()
    }

    /// The headers a replay adds to the saved answer.
    fn replay_headers(&self, response: &mut Response) {
        let flag = |description: &str| {
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(["true"])),
                )
                .description(Some(description))
                .build()
        };
        response.headers.insert(
            self.replay_header.to_owned(),
            flag("`true` when this is the saved first answer to the key, replayed; absent on the first answer"),
        );
        response.headers.insert(
            crate::record::BODY_NOT_KEPT_HEADER.as_str().to_owned(),
            flag("`true` on a replay whose first answer's body was over the saved-body limit: the body is empty"),
        );
    }
}

fn retry_after_header() -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1)),
        )
        .description(Some(
            "Whole seconds to wait before retrying with the same key",
        ))
        .build()
}

fn problem_response(description: &str, retry_after: bool) -> Response {
    let mut response = ResponseBuilder::new().description(description).content(
        "application/problem+json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(PROBLEM_SCHEMA)))
            .build(),
    );
    if retry_after {
        response = response.header("Retry-After", retry_after_header());
    }
    response.build()
}

/// RFC 9457 problem details, as the layer sends them.
pub fn problem_schema() -> Schema {
    let string = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(description))
    };
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "An RFC 9457 problem document (application/problem+json)",
            ))
            .property("type", string("A URI naming the kind of problem"))
            .property("title", string("A short summary of the kind of problem"))
            .property(
                "status",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .description(Some("The HTTP status")),
            )
            .property("detail", string("What went wrong and what to do"))
            .required("type")
            .required("title")
            .required("status")
            .required("detail")
            .build(),
    )
}

impl utoipa::Modify for IdempotencyDoc {
    fn modify(&self, openapi: &mut OpenApi) {
        let mut covered = false;
        for (path, item) in openapi.paths.paths.iter_mut() {
            if let Operations::Paths(paths) = self.operations {
                if !paths.contains(&path.as_str()) {
                    continue;
                }
            }
            for operation in [item.post.as_mut(), item.patch.as_mut()]
                .into_iter()
                .flatten()
            {
                self.document_operation(operation);
                covered = true;
            }
        }
        if covered {
            let components = openapi.components.get_or_insert_with(Default::default);
            components
                .schemas
                .insert(PROBLEM_SCHEMA.to_owned(), RefOr::T(problem_schema()));
        }
    }
}

#[cfg(test)]
mod tests {
    use utoipa::openapi::{path::OperationBuilder, ResponseBuilder};

    use super::*;

    fn operation() -> Operation {
        OperationBuilder::new()
            .response("201", ResponseBuilder::new().description("Created").build())
            .build()
    }

    #[test]
    fn the_default_layer_is_documented_with_its_replay_headers() {
        let mut op = operation();
        IdempotencyDoc::document(&mut op);
        let key = &op.parameters.as_ref().unwrap()[0];
        assert_eq!(key.name, "Idempotency-Key");
        assert!(key.required == Required::True);
        let RefOr::T(created) = &op.responses.responses["201"] else {
            panic!("an inline 201");
        };
        assert!(created.headers.contains_key("Idempotent-Replayed"));
        assert!(created.headers.contains_key("idempotent-body-not-kept"));
        let RefOr::T(conflict) = &op.responses.responses["409"] else {
            panic!("an inline 409");
        };
        assert!(!conflict.headers.contains_key("Idempotent-Replayed"));
        assert!(conflict.headers.contains_key("Retry-After"));
    }

    #[test]
    fn a_configured_layer_is_documented_as_configured() {
        const DOC: IdempotencyDoc = IdempotencyDoc::paths(&["/orders"])
            .with_key_header("X-Request-Key")
            .with_replay_header("X-Replayed")
            .optional();
        let mut op = operation();
        DOC.document_operation(&mut op);
        let key = &op.parameters.as_ref().unwrap()[0];
        assert_eq!(key.name, "X-Request-Key");
        assert!(key.required == Required::False);
        assert!(key
            .description
            .as_deref()
            .unwrap()
            .contains("`X-Replayed: true`"));
        let RefOr::T(created) = &op.responses.responses["201"] else {
            panic!("an inline 201");
        };
        assert!(created.headers.contains_key("X-Replayed"));
        assert!(!created.headers.contains_key("Idempotent-Replayed"));
    }
}
