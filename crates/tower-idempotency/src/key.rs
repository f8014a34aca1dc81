//! The `Idempotency-Key` header: parsing, validation and the scoped hash the stores keep.

use std::fmt;

use http::{header::AUTHORIZATION, request::Parts, HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

/// The longest key accepted, in bytes (after unquoting).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key, as the client sent it (unquoted).
///
/// With the `axum` feature this is also an extractor, so a handler can pass the same key onward,
/// for example to a payment provider:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use tower_idempotency::IdempotencyKey;
///
/// async fn create_charge(key: IdempotencyKey) -> String {
///     format!("forwarding Idempotency-Key {}", key.as_str())
/// }
/// # }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key as the client sent it, without quotes.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parse one header value: the draft's sf-string form (`"abc"`, with `\"` and `\\` escapes) or
    /// the bare form (`abc`). Both name the same key.
    pub fn parse(value: &[u8]) -> Result<Self, KeyError> {
        let raw = if value.first() == Some(&b'"') {
            unquote(value)?
        } else {
            value.to_vec()
        };
        if raw.is_empty() {
            return Err(KeyError::Empty);
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong(raw.len()));
        }
        if !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        // Every byte is visible ASCII, so this cannot fail.
        String::from_utf8(raw)
            .map(Self)
            .map_err(|_| KeyError::NotVisibleAscii)
    }

    /// Read the key from `name` in `headers`. `Ok(None)` when the header is absent.
    pub fn from_headers(headers: &HeaderMap, name: &HeaderName) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(name).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Multiple);
        }
        Self::parse(first.as_bytes()).map(Some)
    }

    /// The hash the stores keep: `sha256(scope || 0x00 || key)`. The raw key is never stored.
    pub fn scoped_hash(&self, scope: &Scope) -> KeyHash {
        let mut hasher = Sha256::new();
        hasher.update(scope.0);
        hasher.update([0]);
        hasher.update(self.0.as_bytes());
        KeyHash(hasher.finalize().into())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys often carry meaning (an order or payment id) and logs must never hold them.
        write!(f, "IdempotencyKey(<redacted>, len={})", self.0.len())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// RFC 8941 sf-string: `"` chars `"`, where `\` escapes only `"` and `\`.
fn unquote(value: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(value.len());
    let mut bytes = value[1..].iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return Err(KeyError::BadQuoting),
            },
            b'"' => {
                return if bytes.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::BadQuoting)
                };
            }
            _ => out.push(b),
        }
    }
    Err(KeyError::BadQuoting)
}

/// Why an `Idempotency-Key` header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header is empty (or `""`).
    #[error("the key is empty")]
    Empty,
    /// Longer than [`MAX_KEY_LEN`] bytes.
    #[error("the key is {0} bytes long; the limit is 255")]
    TooLong(usize),
    /// A byte outside visible ASCII (0x21-0x7E), such as a space or a control character.
    #[error("the key may only contain visible ASCII characters (0x21-0x7E)")]
    NotVisibleAscii,
    /// A quoted key with an unclosed quote, a bad escape or text after the closing quote.
    #[error("the quoted key is not a valid structured-field string")]
    BadQuoting,
    /// The header appears more than once.
    #[error("the header appears more than once; send exactly one key")]
    Multiple,
}

/// The SHA-256 of a scoped key: the identity of a record in every store.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyHash(pub [u8; 32]);

/// Feeds a map's hasher one word of the digest instead of all 32 bytes: the bytes are already
/// uniform, and the map's own keyed hasher still decides the buckets, so a caller who picks keys
/// cannot aim them at one bucket. Equal hashes have equal words, as `Hash` requires.
impl std::hash::Hash for KeyHash {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_ne_bytes(word));
    }
}

impl KeyHash {
    /// The raw 32 bytes, for `bytea`/`BLOB` columns.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, for Redis key names and logs. Safe to log: it reveals neither key nor scope.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// The key hash written as 64 hex digits (either case), as [`to_hex`](Self::to_hex), logs
    /// and the admin tools show it; `None` for anything else.
    ///
    /// ```
    /// use tower_idempotency::KeyHash;
    ///
    /// let hash = KeyHash([0xab; 32]);
    /// assert_eq!(KeyHash::from_hex(&hash.to_hex()), Some(hash));
    /// assert_eq!(KeyHash::from_hex("ab"), None);
    /// ```
    pub fn from_hex(text: &str) -> Option<Self> {
        let digits = text.as_bytes();
        if digits.len() != 64 {
            return None;
        }
        let digit = |c: u8| (c as char).to_digit(16);
        let mut key = [0u8; 32];
        for (byte, pair) in key.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
        }
        Some(Self(key))
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({})", self.to_hex())
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// `bytes` as lower-case hex: the crate's one hex writer.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// `bytes` as lower-case hex, at the end of `out`.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
}

/// SHA-256 of no bytes.
const EMPTY_IDENTITY_SHA256: [u8; 32] = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
    0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

/// The namespace a key lives in, so one caller can never replay another's response.
///
/// Built from any bytes that identify the caller; only their SHA-256 is kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope([u8; 32]);

impl Scope {
    /// A scope identified by `identity` (a tenant id, a user id, a credential).
    pub fn new(identity: impl AsRef<[u8]>) -> Self {
        let identity = identity.as_ref();
        if identity.is_empty() {
            // Most often: a request without `Authorization`. Its hash is a constant.
            return Self(EMPTY_IDENTITY_SHA256);
        }
        Self(Sha256::digest(identity).into())
    }

    /// `true` for the scope of no identity (`Scope::new("")`): what the default scope gives a
    /// request without `Authorization`. Every such caller shares one key space;
    /// [`require_scope`](crate::Idempotency::require_scope) refuses them.
    pub fn is_anonymous(&self) -> bool {
        self.0 == EMPTY_IDENTITY_SHA256
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({})", hex(&self.0[..8]))
    }
}

/// Chooses the [`Scope`] of a request.
///
/// Implemented for closures `Fn(&Parts) -> Scope` (the request head; the body is not read), so a scope that an auth layer put in
/// the extensions is one line:
///
/// ```
/// use tower_idempotency::{Idempotency, Scope};
///
/// #[derive(Clone)]
/// struct TenantId(String);
///
/// let layer = Idempotency::memory().with_scope(|req: &http::request::Parts| {
///     let tenant = req.extensions.get::<TenantId>().map(|t| t.0.as_str()).unwrap_or("");
///     Scope::new(tenant)
/// });
/// # let _ = layer;
/// ```
pub trait ScopeFn: Send + Sync + 'static {
    /// The scope of the request with this head.
    fn scope(&self, request: &Parts) -> Scope;
}

impl<F> ScopeFn for F
where
    F: Fn(&Parts) -> Scope + Send + Sync + 'static,
{
    fn scope(&self, request: &Parts) -> Scope {
        self(request)
    }
}

/// The default scope: a hash of the `Authorization` header (empty when absent or empty).
///
/// When a request carries several `Authorization` headers, every value is part of the scope, in
/// order, never only the first. Such a request is malformed (the header is not a list), and
/// which value an authentication layer checks is up to that layer: the first, the last, or a
/// refusal. Hashing them all means the scope never depends on a value the caller may not have
/// been authenticated with, so a caller cannot reach another caller's records by adding a
/// header in front of its own credentials. The layer does not refuse such requests itself (a
/// scope is computed, not checked); refuse them in the authentication layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthorizationScope;

impl ScopeFn for AuthorizationScope {
    fn scope(&self, request: &Parts) -> Scope {
        let mut values = request.headers.get_all(AUTHORIZATION).iter();
        let first = values.next().map(|v| v.as_bytes()).unwrap_or_default();
        let Some(second) = values.next() else {
            // One value: its bytes alone, so scopes (and records) are those of a single header.
            return Scope::new(first);
        };
        // A header value never contains `\n`, so the joined bytes are unambiguous.
        let mut joined = first.to_vec();
        for value in std::iter::once(second).chain(values) {
            joined.push(b'\n');
            joined.extend_from_slice(value.as_bytes());
        }
        Scope::new(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        let bare = IdempotencyKey::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        let quoted = IdempotencyKey::parse(b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"").unwrap();
        assert_eq!(bare, quoted);
    }

    #[test]
    fn quoted_escapes_are_unescaped() {
        let key = IdempotencyKey::parse(br#""a\"b\\c""#).unwrap();
        assert_eq!(key.as_str(), r#"a"b\c"#);
    }

    #[test]
    fn invalid_keys_are_refused() {
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(
            IdempotencyKey::parse(b"\"a\\xb\""),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(IdempotencyKey::parse(b"\"ab\"c"), Err(KeyError::BadQuoting));
        assert_eq!(
            IdempotencyKey::parse(b"a b"),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"a\tb"),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(&[b'k'; 256]),
            Err(KeyError::TooLong(256))
        );
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
    }

    #[test]
    fn several_header_values_are_refused() {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers, &name), Ok(None));
        headers.append(&name, "a".parse().unwrap());
        headers.append(&name, "b".parse().unwrap());
        assert_eq!(
            IdempotencyKey::from_headers(&headers, &name),
            Err(KeyError::Multiple)
        );
    }

    #[test]
    fn scope_separates_callers() {
        let key = IdempotencyKey::parse(b"k").unwrap();
        assert_ne!(
            key.scoped_hash(&Scope::new("alice")),
            key.scoped_hash(&Scope::new("bob"))
        );
        assert_eq!(
            key.scoped_hash(&Scope::new("alice")),
            key.scoped_hash(&Scope::new("alice"))
        );
    }

    #[test]
    fn every_authorization_value_is_part_of_the_scope() {
        let with = |values: &[&str]| {
            let mut builder = http::Request::builder();
            for v in values {
                builder = builder.header(AUTHORIZATION, *v);
            }
            AuthorizationScope.scope(&builder.body(()).unwrap().into_parts().0)
        };
        let alice = with(&["Bearer alice"]);
        assert_eq!(alice, Scope::new("Bearer alice"));
        assert_ne!(with(&["Bearer alice", "Bearer mallory"]), alice);
        assert_ne!(with(&["Bearer mallory", "Bearer alice"]), alice);
        assert_ne!(
            with(&["Bearer mallory", "Bearer alice"]),
            with(&["Bearer mallory"])
        );
        assert_ne!(
            with(&["Bearer alice", "Bearer mallory"]),
            with(&["Bearer mallory", "Bearer alice"]),
            "the order counts"
        );
    }

    #[test]
    fn empty_authorization_scopes_like_absent() {
        let absent = http::Request::new(()).into_parts().0;
        let empty = http::Request::builder()
            .header(AUTHORIZATION, "")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(
            AuthorizationScope.scope(&absent),
            AuthorizationScope.scope(&empty)
        );
    }

    #[test]
    fn the_empty_scope_is_the_hash_of_no_bytes() {
        assert_eq!(Scope::new(b"").0, <[u8; 32]>::from(Sha256::digest(b"")));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let key = IdempotencyKey::parse(b"order-4711-secret").unwrap();
        let shown = format!("{key:?}");
        assert_eq!(shown, "IdempotencyKey(<redacted>, len=17)");
        assert!(!shown.contains("4711"));
    }
}
