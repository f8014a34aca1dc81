//! `/admin/idempotency`: the library's operator router (`tower_idempotency::admin`: inspect,
//! forget, sweep, stats), mounted only when `ADMIN_TOKEN` is set, behind a bearer-token check:
//! the library's router has no authentication of its own.

use axum::{
    extract::{Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    Router,
};
use tower_idempotency::admin;

use crate::{config::AdminToken, problem::Problem, Db};

/// The operator routes over `db`'s idempotency store, nested under `/admin/idempotency`, each
/// refused with 401 unless it carries `Authorization: Bearer <token>`. Merge them into the
/// app: `orders_api::app(..).merge(orders_api::admin_routes(&db, token))`.
pub fn admin_routes(db: &Db, token: AdminToken) -> Router {
    let guarded =
        admin::router(db.idempotency_store()).layer(middleware::from_fn_with_state(token, bearer));
    // The app's own layers too (request id, trace, timeout): merged after them, these routes
    // would not pass through them.
    crate::telemetry::layers(Router::new().nest("/admin/idempotency", guarded))
}

/// Let the request through only with the admin token.
async fn bearer(State(token): State<AdminToken>, request: Request, next: Next) -> Response {
    // The scheme's name is case-insensitive (RFC 9110, 11.1): `bearer` is `Bearer`.
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| {
            let value = value.as_bytes();
            let (scheme, token) = value.split_at(value.iter().position(|&b| b == b' ')?);
            scheme
                .eq_ignore_ascii_case(b"bearer")
                .then(|| token.trim_ascii_start())
        });
    if presented.is_some_and(|p| token.matches(p)) {
        return next.run(request).await;
    }
    let mut refused = Problem {
        status: StatusCode::UNAUTHORIZED,
        kind: "unauthorized",
        title: "Admin token required",
        detail: "the admin routes need `Authorization: Bearer <ADMIN_TOKEN>`".to_owned(),
        retry_after: None,
        not_processed: true,
    }
    .into_response();
    refused.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    refused
}
