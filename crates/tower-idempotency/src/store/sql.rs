//! What the PostgreSQL and SQLite stores share: per-key wake-ups for wait mode and the
//! conversions between the layer's types and the SQL columns.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use tokio::sync::Notify;

use super::{StoreError, StoreErrorKind, StoredResponse};
use crate::key::KeyHash;

/// Per-key wake-ups for the waiters of this process. An entry lives while someone waits on it.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    map: Mutex<HashMap<KeyHash, (Arc<Notify>, usize)>>,
}

impl Waiters {
    pub(super) fn register(self: &Arc<Self>, key: KeyHash) -> Waiter {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(key).or_insert_with(|| (Arc::default(), 0));
        entry.1 += 1;
        Waiter {
            notify: entry.0.clone(),
            key,
            waiters: self.clone(),
        }
    }

    pub(super) fn wake(&self, key: &KeyHash) {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((notify, _)) = map.get(key) {
            notify.notify_waiters();
        }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(super) fn wake_all(&self) {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        for (notify, _) in map.values() {
            notify.notify_waiters();
        }
    }
}

/// One registered waiter; unregisters on drop.
pub(super) struct Waiter {
    pub(super) notify: Arc<Notify>,
    key: KeyHash,
    waiters: Arc<Waiters>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut map = self
            .waiters
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = map.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The longest lease or retention the store writes: 100 years, far beyond any useful setting
/// and far inside the range of a timestamp.
pub(super) const MAX_MILLIS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// A duration in whole milliseconds for the SQL, at least 1 (a zero lease would make a claim
/// indistinguishable from a takeover) and at most [`MAX_MILLIS`].
pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .clamp(1, MAX_MILLIS)
}

/// The lease left, from the milliseconds the claim computed.
pub(super) fn remaining(ms: Option<i64>) -> Duration {
    Duration::from_millis(ms.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0))
}

/// The saved response of a `done` record.
pub(super) fn saved_response(
    status: Option<i32>,
    headers: Option<Vec<u8>>,
    body: Option<Vec<u8>>,
) -> Result<StoredResponse, StoreError> {
    let (Some(status), Some(headers), Some(body)) = (status, headers, body) else {
        return Err(StoreError::corrupt("a done record has no saved response"));
    };
    let status = u16::try_from(status).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e))?;
    StoredResponse::from_parts(status, &headers, Bytes::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_clamped() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::from_secs(30)), 30_000);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }

    #[test]
    fn remaining_is_never_negative() {
        assert_eq!(remaining(Some(-5)), Duration::ZERO);
        assert_eq!(remaining(None), Duration::ZERO);
        assert_eq!(remaining(Some(1500)), Duration::from_millis(1500));
    }

    #[test]
    fn a_done_record_without_a_response_is_corrupt() {
        let err = saved_response(None, Some(vec![]), Some(vec![])).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let err = saved_response(Some(-1), Some(vec![]), Some(vec![])).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Corrupt);
        let ok = saved_response(Some(201), Some(b"x-a: 1\n".to_vec()), Some(b"hi".to_vec()));
        assert_eq!(ok.unwrap().status, http::StatusCode::CREATED);
    }

    #[test]
    fn waiters_are_removed_when_the_last_one_leaves() {
        let waiters = Arc::new(Waiters::default());
        let key = KeyHash([1; 32]);
        let a = waiters.register(key);
        let b = waiters.register(key);
        assert!(Arc::ptr_eq(&a.notify, &b.notify));
        drop(a);
        assert_eq!(waiters.map.lock().unwrap().len(), 1);
        drop(b);
        assert!(waiters.map.lock().unwrap().is_empty());
    }
}
