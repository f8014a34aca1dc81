//! Durations in whole milliseconds, as the SQL and Redis consumers write leases, retention and
//! ages: the crate's one conversion.

use std::time::Duration;

/// `duration` in whole milliseconds, saturating.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_saturate() {
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
