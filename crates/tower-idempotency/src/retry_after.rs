//! The `Retry-After` of a 409: when the running attempt's answer should be ready.

use std::{
    collections::{hash_map::Entry, HashMap},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use crate::key::KeyHash;

/// How the `Retry-After` of a 409 (a duplicate of a running attempt) is chosen. Set it with
/// [`with_retry_after`](crate::Idempotency::with_retry_after).
///
/// Whatever the choice, the header is whole seconds, at least 1 and never beyond the time left
/// on the running attempt's lease (after that the key can be taken over, so waiting longer is
/// never useful).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetryAfter {
    /// The default: an estimate of when the running attempt finishes. The layer keeps a moving
    /// average of how long the handler took on this path (the last few dozen attempts weigh
    /// most) and subtracts how long the running attempt has run, when it runs in this process.
    /// Before any attempt on the path has finished, 1 s.
    #[default]
    Estimate,
    /// Always this long (still capped by the lease left).
    Fixed(Duration),
}

/// The weight of the newest duration in the moving average: about the last 10 attempts count.
const WEIGHT_OF_NEWEST: f64 = 0.2;
/// Paths tracked separately at most; others share one average, so that clients sending
/// made-up paths cannot grow the map.
const MAX_PATHS: usize = 256;
/// The answer before any attempt has finished.
const NO_ESTIMATE: Duration = Duration::from_secs(1);

/// Recent handler durations per path, and the start of the attempts running in this process.
#[derive(Debug, Default)]
pub(crate) struct Durations {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    by_path: HashMap<String, Duration>,
    other_paths: Option<Duration>,
    running: HashMap<KeyHash, Instant>,
}

impl Durations {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single insert or assignment: a poisoned lock holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An attempt on `key` starts in this process.
    pub(crate) fn started(&self, key: KeyHash) -> Instant {
        let now = Instant::now();
        self.lock().running.insert(key, now);
        now
    }

    /// The attempt on `key` started at `start` ended after running on `path`.
    pub(crate) fn finished(&self, key: &KeyHash, path: &str, start: Instant) {
        let took = start.elapsed();
        let blend = |slot: &mut Duration| {
            *slot = slot.mul_f64(1.0 - WEIGHT_OF_NEWEST) + took.mul_f64(WEIGHT_OF_NEWEST);
        };
        let mut state = self.lock();
        let State {
            by_path,
            other_paths,
            running,
        } = &mut *state;
        // One lookup per map: this runs once per claimed request.
        if let Entry::Occupied(entry) = running.entry(*key) {
            if *entry.get() == start {
                entry.remove();
            }
        }
        if let Some(slot) = by_path.get_mut(path) {
            blend(slot);
        } else if by_path.len() < MAX_PATHS {
            // The path is copied only the first time it is seen, not on every attempt.
            let mut first = took;
            blend(&mut first);
            by_path.insert(path.to_owned(), first);
        } else {
            blend(other_paths.get_or_insert(took));
        }
    }

    /// When a duplicate should come back, for an attempt on `key` and `path` whose lease has
    /// `lease_remaining` left: whole seconds.
    pub(crate) fn retry_after(
        &self,
        policy: RetryAfter,
        key: &KeyHash,
        path: &str,
        lease_remaining: Duration,
    ) -> Duration {
        let wanted = match policy {
            RetryAfter::Fixed(after) => after,
            RetryAfter::Estimate => {
                let state = self.lock();
                let typical = state
                    .by_path
                    .get(path)
                    .copied()
                    .or(state.other_paths)
                    .unwrap_or(NO_ESTIMATE);
                let elapsed = state
                    .running
                    .get(key)
                    .map_or(Duration::ZERO, Instant::elapsed);
                typical.saturating_sub(elapsed)
            }
        };
        // Whole seconds, as the header carries them: rounded up, but not past the lease left
        // (rounded down, since a second more would pass it), and at least 1.
        let up = crate::error::retry_after_secs(wanted);
        Duration::from_secs(up.min(lease_remaining.as_secs()).max(1))
    }
}

/// Forgets a running attempt when it ends, however it ends (answer, error, panic).
pub(crate) struct Running<'a> {
    pub(crate) durations: &'a Durations,
    pub(crate) key: KeyHash,
    pub(crate) path: &'a str,
    pub(crate) start: Instant,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.durations.finished(&self.key, self.path, self.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> KeyHash {
        KeyHash([n; 32])
    }

    #[tokio::test(start_paused = true)]
    async fn estimate_follows_recent_durations_and_subtracts_elapsed_time() {
        let durations = Durations::default();
        let lease = Duration::from_secs(30);
        assert_eq!(
            durations.retry_after(RetryAfter::Estimate, &key(1), "/a", lease),
            Duration::from_secs(1),
            "no finished attempt yet: 1 s"
        );
        for _ in 0..30 {
            let start = durations.started(key(1));
            tokio::time::advance(Duration::from_secs(8)).await;
            durations.finished(&key(1), "/a", start);
        }
        let estimate = durations.retry_after(RetryAfter::Estimate, &key(2), "/a", lease);
        assert_eq!(estimate, Duration::from_secs(8));
        // The same attempt running for 5 s here: about 3 s left.
        durations.started(key(3));
        tokio::time::advance(Duration::from_secs(5)).await;
        let left = durations.retry_after(RetryAfter::Estimate, &key(3), "/a", lease);
        assert_eq!(left, Duration::from_secs(3));
        // Never beyond the lease left, never under 1 s.
        assert_eq!(
            durations.retry_after(RetryAfter::Estimate, &key(2), "/a", Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            durations.retry_after(RetryAfter::Estimate, &key(3), "/a", lease),
            Duration::from_secs(1)
        );
        // Another path has its own average.
        assert_eq!(
            durations.retry_after(RetryAfter::Estimate, &key(2), "/b", lease),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn fixed_is_capped_by_the_lease_left() {
        let durations = Durations::default();
        let fixed = RetryAfter::Fixed(Duration::from_secs(5));
        assert_eq!(
            durations.retry_after(fixed, &key(1), "/", Duration::from_secs(30)),
            Duration::from_secs(5)
        );
        assert_eq!(
            durations.retry_after(fixed, &key(1), "/", Duration::from_secs(3)),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn whole_seconds_never_pass_the_lease_left() {
        let durations = Durations::default();
        let after = |fixed: u64, lease_left: u64| {
            let fixed = RetryAfter::Fixed(Duration::from_millis(fixed));
            durations.retry_after(fixed, &key(1), "/", Duration::from_millis(lease_left))
        };
        // Rounded up while that stays inside the lease left.
        assert_eq!(after(1_200, 30_000), Duration::from_secs(2));
        assert_eq!(after(2_000, 30_000), Duration::from_secs(2));
        // A second more would pass the lease left: rounded down.
        assert_eq!(after(1_200, 1_500), Duration::from_secs(1));
        assert_eq!(after(60_000, 29_300), Duration::from_secs(29));
        // At least 1, even with less than a second of lease left.
        assert_eq!(after(5_000, 400), Duration::from_secs(1));
        assert_eq!(after(0, 30_000), Duration::from_secs(1));
    }

    #[test]
    fn made_up_paths_do_not_grow_the_map() {
        let durations = Durations::default();
        for i in 0..10 * MAX_PATHS {
            let start = durations.started(key(0));
            durations.finished(&key(0), &format!("/p/{i}"), start);
        }
        let state = durations.lock();
        assert_eq!(state.by_path.len(), MAX_PATHS);
        assert!(state.running.is_empty());
    }
}
