//! One key per intent: the caller's if it set one, else a fresh UUID for keyed methods.

use http::{HeaderMap, HeaderValue, Method};
use uuid::Uuid;

use crate::config::{KeyMode, RetryConfig, IDEMPOTENCY_KEY};

/// The key this intent's attempts carry, added to `headers` if the policy generates one.
///
/// `None` means the request goes out without a key, so it must be sent once only.
pub(crate) fn ensure_key(
    config: &RetryConfig,
    method: &Method,
    headers: &mut HeaderMap,
) -> Option<HeaderValue> {
    if let Some(existing) = headers.get(IDEMPOTENCY_KEY) {
        return Some(existing.clone());
    }
    if !config.keyed_methods.contains(method) {
        return None;
    }
    let key = match config.key_mode {
        KeyMode::UuidV4 => Uuid::new_v4(),
        KeyMode::UuidV7 => Uuid::now_v7(),
        KeyMode::CallerProvided => return None,
    };
    let value = HeaderValue::from_str(&key.hyphenated().to_string())
        .expect("a hyphenated UUID is a valid header value");
    headers.insert(IDEMPOTENCY_KEY, value.clone());
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
