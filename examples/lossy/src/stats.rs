//! What the naive client should produce, and how far chance may move it.
//!
//! Each answer is lost with probability `p`, independently. A naive intent sends attempts until
//! one answer gets through; every attempt reached the server and created an order, so its
//! duplicates are the lost answers before the first delivered one: a geometric count with mean
//! `p / (1 - p)` and variance `p / (1 - p)^2`. Over `n` intents the duplicates have
//!
//! - mean `n p / (1 - p)` (the same as attempts x p, since attempts = n + duplicates), and
//! - standard deviation `sqrt(n p) / (1 - p)`.
//!
//! The cap on attempts changes this by about `n p^MAX_ATTEMPTS`, nothing at these rates.

/// The expected duplicates of the naive client and their standard deviation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expected {
    /// The mean.
    pub mean: f64,
    /// The standard deviation.
    pub sd: f64,
}

impl Expected {
    /// For `intents` intents and a loss rate `p` (below 1).
    pub fn naive_duplicates(intents: u64, p: f64) -> Self {
        let n = intents as f64;
        Self {
            mean: n * p / (1.0 - p),
            sd: (n * p).sqrt() / (1.0 - p),
        }
    }

    /// How many standard deviations `observed` lies from the mean.
    pub fn sigmas(&self, observed: u64) -> f64 {
        if self.sd == 0.0 {
            return if observed as f64 == self.mean {
                0.0
            } else {
                f64::INFINITY
            };
        }
        (observed as f64 - self.mean).abs() / self.sd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_thousand_intents_at_ten_percent() {
        let e = Expected::naive_duplicates(2000, 0.1);
        assert!((e.mean - 222.222).abs() < 0.001);
        assert!((e.sd - 15.713).abs() < 0.001);
        assert!(e.sigmas(222) < 0.1);
        assert!(e.sigmas(300) > 4.0);
    }

    #[test]
    fn no_loss_no_duplicates() {
        let e = Expected::naive_duplicates(2000, 0.0);
        assert_eq!(e.mean, 0.0);
        assert_eq!(e.sigmas(0), 0.0);
        assert!(e.sigmas(1).is_infinite());
    }
}
