//! Before the claim: the key from its header, the body buffered within its limit and time, the
//! key scoped and the request fingerprinted. Each refusal here is answered before anything is
//! claimed.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{header::CONTENT_LENGTH, Request};
use http_body::Body;
use http_body_util::BodyExt;

use super::refuse::Refusal;
use crate::{
    body::{BoxError, RequestBody},
    config::Config,
    error::Rejection,
    fingerprint::Fingerprint,
    key::{IdempotencyKey, KeyHash},
    timeout::within,
};

/// The key from its header: `None` when absent and the layer lets such requests through.
pub(super) fn read_key(
    config: &Config,
    headers: &http::HeaderMap,
) -> Result<Option<IdempotencyKey>, Refusal> {
    match IdempotencyKey::from_headers(headers, &config.header) {
        Ok(Some(key)) => Ok(Some(key)),
        Ok(None) if config.required => Err(Refusal {
            rejection: Rejection::MissingKey {
                header: display_name(&config.header),
            },
            note: "no idempotency key: 400",
        }),
        Ok(None) => Ok(None),
        Err(reason) => Err(Refusal {
            rejection: Rejection::InvalidKey {
                header: display_name(&config.header),
                reason,
            },
            note: "invalid idempotency key: 400",
        }),
    }
}

/// A keyed request ready to claim: its body buffered, its key scoped, its fingerprint taken.
pub(super) struct Prepared {
    pub(super) parts: http::request::Parts,
    pub(super) bytes: Bytes,
    pub(super) key: IdempotencyKey,
    pub(super) key_hash: KeyHash,
    pub(super) fingerprint: Fingerprint,
}

impl Prepared {
    /// The request for the handler: as it came, its body buffered, its key in the extensions
    /// (for the [`IdempotencyKey`] extractor, with a claim or, fail-open, without one).
    pub(super) fn into_request<B>(self) -> Request<RequestBody<B>> {
        let Self {
            mut parts,
            bytes,
            key,
            ..
        } = self;
        parts.extensions.insert(key);
        Request::from_parts(parts, RequestBody::buffered(bytes))
    }
}

/// Buffer the body, scope the key, fingerprint the request.
pub(super) async fn prepare<B>(
    config: &Config,
    parts: http::request::Parts,
    body: B,
    key: IdempotencyKey,
) -> Result<Prepared, Refusal>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    // The scope first: an anonymous caller under `require_scope` is refused before its body is read.
    let scope = config.scope.scope(&parts);
    if config.require_scope && scope.is_anonymous() {
        return Err(Refusal {
            rejection: Rejection::MissingScope,
            note: "no caller identity and the layer requires a scope: 400",
        });
    }
    let bytes = read_body(config, &parts.headers, body).await?;
    let key_hash = key.scoped_hash(&scope);
    let fingerprint = config.fingerprint.fingerprint(&parts, &bytes);
    Ok(Prepared {
        parts,
        bytes,
        key,
        key_hash,
        fingerprint,
    })
}

/// The whole body, up to the limit (413 over it, refused from `Content-Length` when it says so).
async fn read_body<B>(config: &Config, headers: &http::HeaderMap, body: B) -> Result<Bytes, Refusal>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let too_large = || Rejection::BodyTooLarge {
        limit: config.body_limit,
    };
    let declared_len = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|len| len > config.body_limit as u64) {
        return Err(Refusal {
            rejection: too_large(),
            note: "the declared body is over the limit: 413",
        });
    }
    let read = collect_up_to(body, config.body_limit);
    match within(config.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(Unread::TooLarge)) => Err(Refusal {
            rejection: too_large(),
            note: "the body is over the limit: 413",
        }),
        Ok(Err(Unread::Failed)) => Err(Refusal {
            rejection: Rejection::UnreadableBody,
            note: "the body could not be read: 400",
        }),
        Err(_elapsed) => Err(Refusal {
            rejection: Rejection::BodyTimeout {
                timeout: config.body_timeout,
            },
            note: "the body did not arrive within the body timeout: 408",
        }),
    }
}

/// Why a body was not read whole.
enum Unread {
    /// Over the limit.
    TooLarge,
    /// The body failed.
    Failed,
}

/// The body's bytes, up to `limit`: what `Limited` and `collect` give, without their queue of
/// frames. The first frame is kept as it came, and copied only when another follows; most request
/// bodies are one frame.
async fn collect_up_to<B: Body>(body: B, limit: usize) -> Result<Bytes, Unread> {
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut more = BytesMut::new();
    let mut read = 0;
    while let Some(frame) = body.as_mut().frame().await {
        let Ok(frame) = frame else {
            return Err(Unread::Failed);
        };
        // Trailers are not part of the bytes.
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        let len = data.remaining();
        if len > limit - read {
            return Err(Unread::TooLarge);
        }
        read += len;
        if read == len {
            first = data.copy_to_bytes(len);
        } else {
            if more.is_empty() {
                more.extend_from_slice(&std::mem::take(&mut first));
            }
            more.put(data);
        }
    }
    Ok(if more.is_empty() {
        first
    } else {
        more.freeze()
    })
}

/// A header name as people write it (`Idempotency-Key`), for error details; `HeaderName` keeps
/// names in lower case.
fn display_name(name: &http::HeaderName) -> String {
    name.as_str()
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_shown_as_written_in_requests() {
        assert_eq!(
            display_name(&crate::config::DEFAULT_HEADER_NAME),
            "Idempotency-Key"
        );
        assert_eq!(
            display_name(&http::HeaderName::from_static("x-request-key")),
            "X-Request-Key"
        );
    }
}
