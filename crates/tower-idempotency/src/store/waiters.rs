//! What every store uses to wake the waiters of this process: one per-key registry of
//! [`Notify`]s, and a lock that survives a panic.

// With the memory store alone, only `lock` is used.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "redis")),
    allow(dead_code)
)]

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tokio::sync::Notify;

/// Lock `mutex`, whatever panicked while holding it: the stores' maps hold no invariant a panic
/// could break halfway (every write is one insert, removal or field assignment).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Per-key wake-ups for the waiters of this process (a key is a record's [`KeyHash`] or a
/// notification channel). An entry lives while someone waits on it.
///
/// [`KeyHash`]: crate::KeyHash
#[derive(Debug)]
pub(crate) struct Waiters<K> {
    map: Mutex<HashMap<K, (Arc<Notify>, usize)>>,
}

impl<K> Default for Waiters<K> {
    fn default() -> Self {
        Self {
            map: Mutex::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> Waiters<K> {
    /// Register a waiter on `key`; it is unregistered when the returned [`Waiter`] drops.
    pub(crate) fn register(self: &Arc<Self>, key: K) -> Waiter<K> {
        let mut map = lock(&self.map);
        let entry = map
            .entry(key.clone())
            .or_insert_with(|| (Arc::default(), 0));
        entry.1 += 1;
        Waiter {
            notify: entry.0.clone(),
            key: Some(key),
            waiters: self.clone(),
        }
    }

    /// Wake every waiter on `key`.
    pub(crate) fn wake(&self, key: &K) {
        if let Some((notify, _)) = lock(&self.map).get(key) {
            notify.notify_waiters();
        }
    }

    /// Wake every waiter on every key (the notification source was lost).
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        for (notify, _) in lock(&self.map).values() {
            notify.notify_waiters();
        }
    }

    /// Whether anyone waits on `key`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn is_watched(&self, key: &K) -> bool {
        lock(&self.map).contains_key(key)
    }

    /// One waiter on `key` less; `true` when it was the last.
    fn unregister(&self, key: &K) -> bool {
        let mut map = lock(&self.map);
        match map.get_mut(key) {
            Some(entry) if entry.1 > 1 => {
                entry.1 -= 1;
                false
            }
            Some(_) => {
                map.remove(key);
                true
            }
            None => false,
        }
    }
}

/// One registered waiter; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Waiter<K: Hash + Eq + Clone> {
    pub(crate) notify: Arc<Notify>,
    key: Option<K>,
    waiters: Arc<Waiters<K>>,
}

impl<K: Hash + Eq + Clone> Waiter<K> {
    /// Unregister now; `Some(key)` when this was the key's last waiter.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn unregister(mut self) -> Option<K> {
        let key = self.key.take()?;
        self.waiters.unregister(&key).then_some(key)
    }
}

impl<K: Hash + Eq + Clone> Drop for Waiter<K> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.waiters.unregister(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyHash;

    #[test]
    fn waiters_are_removed_when_the_last_one_leaves() {
        let waiters = Arc::new(Waiters::<KeyHash>::default());
        let key = KeyHash([1; 32]);
        let a = waiters.register(key);
        let b = waiters.register(key);
        assert!(Arc::ptr_eq(&a.notify, &b.notify));
        drop(a);
        assert_eq!(waiters.map.lock().unwrap().len(), 1);
        drop(b);
        assert!(waiters.map.lock().unwrap().is_empty());
    }

    #[test]
    fn the_last_waiter_to_leave_says_so() {
        let waiters = Arc::new(Waiters::<String>::default());
        let a = waiters.register("ch".to_owned());
        let b = waiters.register("ch".to_owned());
        assert_eq!(a.unregister(), None);
        assert!(waiters.is_watched(&"ch".to_owned()));
        assert_eq!(b.unregister(), Some("ch".to_owned()));
        assert!(!waiters.is_watched(&"ch".to_owned()));
    }
}
