//! The Lua scripts (one file each under `scripts/`), how they are sent (`EVALSHA`, reloaded on
//! `NOSCRIPT`) and how the claim script's reply is decoded.

use std::sync::LazyLock;

use bytes::Bytes;
use redis::{
    aio::ConnectionManager, ErrorKind, RedisResult, Script, ScriptInvocation, ServerErrorKind,
    Value,
};

use crate::store::{
    record::time::from_millis, ClaimOutcome, RecordInfo, StoreError, StoredResponse,
};

/// A script that reads the clock: `prologue.lua` (which sets `now`), then `$file`.
macro_rules! timed_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/prologue.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        })
    };
}

/// KEYS[1] record; ARGV: fingerprint, token, lease ms, ttl ms.
pub(super) static CLAIM: LazyLock<Script> = timed_script!("claim.lua");

/// KEYS[1] record; ARGV: token, lease ms.
pub(super) static RENEW: LazyLock<Script> = timed_script!("renew.lua");

/// KEYS[1] record; ARGV: token, status, headers, body, channel.
pub(super) static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/complete.lua")));

/// KEYS[1] record; ARGV: token, channel.
pub(super) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));

/// KEYS[1] record. Read-only: the lease time left of a running record, 0 for anything else.
pub(super) static PEEK: LazyLock<Script> = timed_script!("peek.lua");

/// KEYS[1] record. Read-only, for operators: state, lease and expiry left, saved answer.
pub(super) static GET: LazyLock<Script> = timed_script!("get.lua");

/// KEYS[1] record; ARGV: channel. For operators: delete the record whatever its state.
pub(super) static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/forget.lua")));

/// The reply of [`GET`] as the record it describes.
pub(super) fn record_info(reply: Value) -> Result<Option<RecordInfo>, StoreError> {
    const UNEXPECTED: &str = "unexpected reply from the redis get script";
    let Value::Array(items) = reply else {
        return Err(StoreError::corrupt(UNEXPECTED));
    };
    if items.is_empty() {
        return Ok(None);
    }
    let mut items = items.into_iter();
    let corrupt = || StoreError::corrupt(UNEXPECTED);
    let state = items.next().and_then(bytes_of).ok_or_else(corrupt)?;
    let mut millis = || {
        items
            .next()
            .and_then(int_of)
            .map(from_millis)
            .ok_or_else(corrupt)
    };
    let lease = millis()?;
    let expires_in = millis()?;
    let (status, headers, body, age) = (items.next(), items.next(), items.next(), items.next());
    let aged = |info: RecordInfo| match age.and_then(int_of) {
        Some(ms) if ms >= 0 => info.with_age(from_millis(ms)),
        _ => info,
    };
    match state.as_slice() {
        b"running" => Ok(Some(aged(RecordInfo::running(lease, expires_in)))),
        b"done" => {
            let status = status
                .and_then(int_of)
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| StoreError::corrupt("a saved redis record has no valid status"))?;
            let headers = headers.and_then(bytes_of).unwrap_or_default();
            let body = body.and_then(bytes_of).unwrap_or_default();
            let response = StoredResponse::from_parts(status, &headers, Bytes::from(body))?;
            Ok(Some(aged(RecordInfo::done(response, expires_in))))
        }
        _ => Err(StoreError::corrupt("a redis record has an unknown state")),
    }
}

/// The connection the scripts run on.
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

/// How many times a script is sent when the server keeps answering `NOSCRIPT`.
const NOSCRIPT_ATTEMPTS: usize = 3;

impl Connection {
    /// `EVALSHA`, with `SCRIPT LOAD` and a retry on `NOSCRIPT` (done by [`ScriptInvocation`]).
    ///
    /// A `SCRIPT FLUSH` (or a failover to a node that never saw the script) between the load and
    /// the retry makes that retry fail with `NOSCRIPT` too, so the whole exchange is repeated a
    /// few times. Running a script twice is impossible: `NOSCRIPT` means it did not run.
    pub(super) async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<Value> {
        let mut attempt = 1;
        loop {
            let result = match self {
                Connection::Single(conn) => invocation.invoke_async(&mut conn.clone()).await,
                #[cfg(feature = "redis-cluster")]
                Connection::Cluster(conn) => invocation.invoke_async(&mut conn.clone()).await,
            };
            match result {
                Err(err)
                    if attempt < NOSCRIPT_ATTEMPTS
                        && err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

/// The bytes of a string-like reply.
fn bytes_of(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

/// An integer reply, or a string-like reply holding one.
fn int_of(value: Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(n),
        other => std::str::from_utf8(&bytes_of(other)?).ok()?.parse().ok(),
    }
}

/// Decode the claim script's reply.
pub(super) fn claim_outcome(reply: Value) -> Result<ClaimOutcome, StoreError> {
    const UNEXPECTED: &str = "unexpected reply from the redis claim script";
    let Value::Array(items) = reply else {
        return Err(StoreError::corrupt(UNEXPECTED));
    };
    let mut items = items.into_iter();
    let tag = items
        .next()
        .and_then(bytes_of)
        .ok_or_else(|| StoreError::corrupt(UNEXPECTED))?;
    let mut next_int = || {
        items
            .next()
            .and_then(int_of)
            .ok_or_else(|| StoreError::corrupt(UNEXPECTED))
    };
    match tag.as_slice() {
        b"claimed" => Ok(ClaimOutcome::Claimed {
            taken_over: next_int()? != 0,
        }),
        b"inflight" => Ok(ClaimOutcome::InFlight {
            lease_remaining: from_millis(next_int()?),
        }),
        b"mismatch" => Ok(ClaimOutcome::Mismatch),
        b"done" => {
            let status = next_int()
                .ok()
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| StoreError::corrupt("a saved redis record has no valid status"))?;
            let headers = items.next().and_then(bytes_of).unwrap_or_default();
            let body = items.next().and_then(bytes_of).unwrap_or_default();
            Ok(ClaimOutcome::Done(StoredResponse::from_parts(
                status,
                &headers,
                Bytes::from(body),
            )?))
        }
        b"corrupt" => Err(StoreError::corrupt(
            "a redis record lacks its fingerprint, state, lease or expiry",
        )),
        _ => Err(StoreError::corrupt(UNEXPECTED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreErrorKind;

    fn array(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn bulk(text: &[u8]) -> Value {
        Value::BulkString(text.to_vec())
    }

    #[test]
    fn claim_replies_decode() {
        assert_eq!(
            claim_outcome(array(vec![bulk(b"claimed"), Value::Int(1)])).unwrap(),
            ClaimOutcome::Claimed { taken_over: true }
        );
        assert_eq!(
            claim_outcome(array(vec![bulk(b"inflight"), Value::Int(1500)])).unwrap(),
            ClaimOutcome::InFlight {
                lease_remaining: std::time::Duration::from_millis(1500)
            }
        );
        assert_eq!(
            claim_outcome(array(vec![bulk(b"mismatch")])).unwrap(),
            ClaimOutcome::Mismatch
        );
        let done = claim_outcome(array(vec![
            bulk(b"done"),
            bulk(b"201"),
            bulk(b"x-a: 1\nx-a: 2\n"),
            bulk(b"\x00body"),
        ]))
        .unwrap();
        let ClaimOutcome::Done(saved) = done else {
            panic!("expected done, got {done:?}");
        };
        assert_eq!(saved.status, http::StatusCode::CREATED);
        assert_eq!(saved.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(saved.body, Bytes::from_static(b"\x00body"));
    }

    #[test]
    fn corrupt_replies_are_errors_not_panics() {
        for reply in [
            Value::Nil,
            array(vec![]),
            array(vec![bulk(b"claimed")]),
            array(vec![bulk(b"done"), Value::Nil, Value::Nil, Value::Nil]),
            array(vec![bulk(b"done"), bulk(b"99999"), Value::Nil, Value::Nil]),
            array(vec![
                bulk(b"done"),
                bulk(b"200"),
                bulk(b"bad header"),
                Value::Nil,
            ]),
            array(vec![bulk(b"corrupt")]),
            array(vec![bulk(b"what")]),
        ] {
            let err = claim_outcome(reply).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        }
    }
}
