//! Durations in whole milliseconds, as the SQL and Redis consumers write leases, retention and
//! ages: the crate's one conversion.

use std::time::Duration;

/// The longest lease or retention written: 100 years in milliseconds, far beyond any useful
/// setting and inside what Redis' `PX` and PostgreSQL's intervals take (`Duration::MAX`, a
/// natural way to say "for ever", is cut to it).
const MAX_MILLIS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// `duration` in whole milliseconds, at most [`MAX_MILLIS`].
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(MAX_MILLIS)
        .min(MAX_MILLIS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_cut_to_a_century() {
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
    }
}
