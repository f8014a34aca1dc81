//! One key per intent: the caller's if it set one, else a fresh UUID for keyed methods.

use http::{HeaderMap, HeaderValue, Method};
use uuid::Uuid;

#[cfg(test)]
use crate::config::IDEMPOTENCY_KEY;
use crate::config::{KeyMode, RetryConfig};

/// Where an intent's key comes from, when the request carries none: for example a row of your
/// outbox, so that a process that restarts retries the intent with the same key.
///
/// Set it with [`RetryConfig::with_key_source`]; it is asked only for requests of a keyed method
/// that carry no key header. `None` sends the request unkeyed, once. Closures
/// `Fn(&Method, &HeaderMap) -> Option<HeaderValue>` are key sources:
///
/// ```
/// use http::{HeaderMap, HeaderValue, Method};
/// use tower_idempotency_client::RetryConfig;
///
/// // The outbox relay puts the row's id in `x-outbox-id`; the key is derived from it.
/// let config = RetryConfig::default().with_key_source(|_: &Method, headers: &HeaderMap| {
///     let row = headers.get("x-outbox-id")?.to_str().ok()?;
///     HeaderValue::from_str(&format!("outbox-{row}")).ok()
/// });
/// ```
pub trait KeySource: Send + Sync + 'static {
    /// The key for this request, or `None` to send it unkeyed (once).
    fn key(&self, method: &Method, headers: &HeaderMap) -> Option<HeaderValue>;
}

impl<F> KeySource for F
where
    F: Fn(&Method, &HeaderMap) -> Option<HeaderValue> + Send + Sync + 'static,
{
    fn key(&self, method: &Method, headers: &HeaderMap) -> Option<HeaderValue> {
        self(method, headers)
    }
}

/// The key this intent's attempts carry, added to `headers` if the policy generates one.
///
/// `None` means the request goes out without a key, so it must be sent once only.
pub(crate) fn ensure_key(
    config: &RetryConfig,
    method: &Method,
    headers: &mut HeaderMap,
) -> Option<HeaderValue> {
    if let Some(existing) = headers.get(&config.header) {
        return Some(existing.clone());
    }
    if !config.keyed_methods.contains(method) {
        return None;
    }
    if let Some(source) = &config.key_source {
        let value = source.key(method, headers)?;
        headers.insert(config.header.clone(), value.clone());
        return Some(value);
    }
    let key = match config.key_mode {
        KeyMode::UuidV4 => Uuid::new_v4(),
        KeyMode::UuidV7 => Uuid::now_v7(),
        KeyMode::CallerProvided => return None,
    };
    let value = HeaderValue::from_str(&key.hyphenated().to_string())
        .expect("a hyphenated UUID is a valid header value");
    headers.insert(config.header.clone(), value.clone());
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(config: &RetryConfig, method: Method, headers: &mut HeaderMap) -> Option<Uuid> {
        ensure_key(config, &method, headers).map(|v| Uuid::parse_str(v.to_str().unwrap()).unwrap())
    }

    #[test]
    fn keyed_methods_get_a_fresh_uuid_each() {
        let config = RetryConfig::default();
        let mut first = HeaderMap::new();
        let mut second = HeaderMap::new();
        let a = key_of(&config, Method::POST, &mut first).unwrap();
        let b = key_of(&config, Method::PATCH, &mut second).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.get_version_num(), 4);
        assert_eq!(first[IDEMPOTENCY_KEY], a.to_string());
    }

    #[test]
    fn v7_keys_when_asked() {
        let config = RetryConfig::default().with_key_mode(KeyMode::UuidV7);
        let key = key_of(&config, Method::POST, &mut HeaderMap::new()).unwrap();
        assert_eq!(key.get_version_num(), 7);
    }

    #[test]
    fn the_callers_key_is_kept() {
        let config = RetryConfig::default();
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static("order-42"));
        assert_eq!(
            ensure_key(&config, &Method::GET, &mut headers).unwrap(),
            "order-42"
        );
        assert_eq!(headers.get_all(IDEMPOTENCY_KEY).iter().count(), 1);
    }

    #[test]
    fn another_header_name_and_a_key_source() {
        let config = RetryConfig::default()
            .with_header_name(http::HeaderName::from_static("x-request-key"))
            .with_key_source(|_: &Method, headers: &HeaderMap| {
                let row = headers.get("x-outbox-id")?.to_str().ok()?;
                HeaderValue::from_str(&format!("outbox-{row}")).ok()
            });
        let mut headers = HeaderMap::new();
        headers.insert("x-outbox-id", HeaderValue::from_static("42"));
        assert_eq!(
            ensure_key(&config, &Method::POST, &mut headers).unwrap(),
            "outbox-42"
        );
        assert_eq!(headers["x-request-key"], "outbox-42");
        assert!(headers.get(IDEMPOTENCY_KEY).is_none());
        // The same row after a restart: the same key.
        let mut again = HeaderMap::new();
        again.insert("x-outbox-id", HeaderValue::from_static("42"));
        assert_eq!(
            ensure_key(&config, &Method::POST, &mut again).unwrap(),
            "outbox-42"
        );
        // No row: unkeyed, sent once.
        assert_eq!(
            ensure_key(&config, &Method::POST, &mut HeaderMap::new()),
            None
        );
    }

    #[test]
    fn no_key_for_other_methods_or_when_the_caller_provides_them() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            ensure_key(&RetryConfig::default(), &Method::GET, &mut headers),
            None
        );
        let caller = RetryConfig::default().with_key_mode(KeyMode::CallerProvided);
        assert_eq!(ensure_key(&caller, &Method::POST, &mut headers), None);
        assert!(headers.is_empty());
    }
}
