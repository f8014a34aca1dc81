//! One key per intent: the caller's if it set one, else a fresh UUID for keyed methods.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use uuid::Uuid;

/// Which requests get a key.
///
/// A request that already carries an `Idempotency-Key` keeps it in every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyMode {
    /// Add a random UUID (version 4) to requests of a keyed method that carry none. The default.
    #[default]
    UuidV4,
    /// Add a time-ordered UUID (version 7), which some stores index more cheaply.
    UuidV7,
    /// Never add a key: only requests the caller keyed are retried; the others are sent once.
    CallerProvided,
}

/// Where an intent's key comes from, when the request carries none: for example a row of your
/// outbox, so that a process that restarts retries the intent with the same key.
///
/// Set it with [`RetryConfig::with_key_source`](crate::RetryConfig::with_key_source); it is
/// asked only for requests of a keyed method that carry no key header. `None` sends the request
/// unkeyed, once. Closures `Fn(&Method, &HeaderMap) -> Option<HeaderValue>` are key sources:
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

/// What decides an intent's key: the settings of [`RetryConfig`](crate::RetryConfig) that
/// concern it.
#[derive(Clone)]
pub(crate) struct KeyRules {
    pub(crate) mode: KeyMode,
    pub(crate) methods: Vec<Method>,
    pub(crate) header: HeaderName,
    pub(crate) source: Option<Arc<dyn KeySource>>,
}

impl KeyRules {
    /// The key this intent's attempts carry, added to `headers` if the rules generate one.
    ///
    /// `None` means the request goes out without a key, so it must be sent once only.
    pub(crate) fn ensure_key(
        &self,
        method: &Method,
        headers: &mut HeaderMap,
    ) -> Option<HeaderValue> {
        if let Some(existing) = headers.get(&self.header) {
            return Some(existing.clone());
        }
        if !self.methods.contains(method) {
            return None;
        }
        if let Some(source) = &self.source {
            let value = source.key(method, headers)?;
            headers.insert(self.header.clone(), value.clone());
            return Some(value);
        }
        let key = match self.mode {
            KeyMode::UuidV4 => Uuid::new_v4(),
            KeyMode::UuidV7 => Uuid::now_v7(),
            KeyMode::CallerProvided => return None,
        };
        let value = HeaderValue::from_str(&key.hyphenated().to_string())
            .expect("a hyphenated UUID is a valid header value");
        headers.insert(self.header.clone(), value.clone());
        Some(value)
    }
}
