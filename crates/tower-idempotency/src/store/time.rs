//! Durations in whole milliseconds, as every store writes leases and retention and reads the time
//! left on them: the crate's one conversion each way.

use std::time::Duration;

/// The longest lease or retention a store writes: 100 years, far beyond any useful setting, far
/// inside the range of a timestamp, and exact as a Lua number (Redis' scripts).
pub(crate) const MAX_MILLIS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// `duration` in whole milliseconds, at most [`MAX_MILLIS`].
pub(crate) fn to_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .min(MAX_MILLIS)
}

/// The milliseconds a store reported (time left on a lease, or before expiry) as a duration; a
/// negative count, a time already past, is zero.
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis"
))]
pub(crate) fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_whole_milliseconds_within_bounds() {
        assert_eq!(to_millis(Duration::from_micros(1500)), 1);
        assert_eq!(to_millis(Duration::from_secs(30)), 30_000);
        assert_eq!(to_millis(Duration::MAX), MAX_MILLIS);
        assert_eq!(from_millis(-5), Duration::ZERO);
        assert_eq!(from_millis(1500), Duration::from_millis(1500));
    }
}
