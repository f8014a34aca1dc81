//! The retry core both front ends run: one intent's attempts, the decision after each, the
//! backoff, and what is counted.
//!
//! The tower service and the reqwest middleware differ only in how they send one attempt and
//! read its result ([`Attempt`]); [`drive`] is the one loop around it.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::time::Instant;
use tower::{
    retry::budget::Budget,
    util::rng::{HasherRng, Rng},
};

use crate::{
    classify::Verdict,
    config::{ConfigError, RetryConfig},
};

/// The tracing target of this crate's events.
pub(crate) const TARGET: &str = "tower_idempotency_client";

/// A validated config and its budget, shared by every clone of a layer or middleware.
#[derive(Clone)]
pub(crate) struct Policy {
    pub(crate) config: Arc<RetryConfig>,
    budget: Arc<dyn Budget + Send + Sync>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Policy {
    pub(crate) fn new(config: RetryConfig) -> Result<Self, ConfigError> {
        let budget = config.validate()?;
        Ok(Self {
            config: Arc::new(config),
            budget,
        })
    }

    /// Start an intent. Only a keyed intent may be retried, and only it feeds the budget.
    pub(crate) fn start(&self, keyed: bool) -> Intent {
        if keyed {
            self.budget.deposit();
        }
        Intent {
            policy: self.clone(),
            keyed,
            started: Instant::now(),
            attempts: 0,
            rng: HasherRng::default(),
        }
    }
}

/// One attempt, as a front end sends it and reads its result.
pub(crate) trait Attempt {
    /// A successful attempt's answer.
    type Response;
    /// A failed attempt's error.
    type Error;

    /// Send one attempt (the same key every time).
    fn send(&mut self) -> impl Future<Output = Result<Self::Response, Self::Error>> + Send + '_;

    /// What the config's classifier says about the result.
    fn classify(&self, result: &Result<Self::Response, Self::Error>) -> Verdict;
}

/// How an intent ended.
#[derive(Debug)]
pub(crate) enum Ended<R, E> {
    /// The last attempt's answer or error.
    Result(Result<R, E>),
    /// The last attempt had no answer within `timeout`.
    TimedOut {
        /// The time it was given.
        timeout: Duration,
    },
}

/// Send attempts until one may not be retried; returns how it ended and the attempts sent.
pub(crate) async fn drive<A: Attempt>(
    mut intent: Intent,
    attempt: &mut A,
) -> (Ended<A::Response, A::Error>, u32) {
    loop {
        let timeout = intent.begin_attempt();
        let (verdict, ended) = match tokio::time::timeout(timeout, attempt.send()).await {
            Ok(result) => (attempt.classify(&result), Ended::Result(result)),
            Err(_) => (
                intent.policy.config.classifier.timed_out(),
                Ended::TimedOut { timeout },
            ),
        };
        match intent.retry_after(verdict) {
            Some(wait) => {
                drop(ended);
                tokio::time::sleep(wait).await;
            }
            None => return (ended, intent.attempts),
        }
    }
}

/// One intent's attempts: the clock, the count and the decision to go on.
#[derive(Debug)]
pub(crate) struct Intent {
    policy: Policy,
    keyed: bool,
    started: Instant,
    attempts: u32,
    rng: HasherRng,
}

impl Intent {
    /// Count an attempt, and return how long it may take: the attempt timeout, or less if the
    /// deadline comes first.
    fn begin_attempt(&mut self) -> Duration {
        self.attempts += 1;
        observe::attempt();
        let config = &self.policy.config;
        let left = config.deadline.saturating_sub(self.started.elapsed());
        config.attempt_timeout.min(left)
    }

    /// How long to wait before the next attempt, or `None` to stop and hand the result back.
    fn retry_after(&mut self, verdict: Verdict) -> Option<Duration> {
        let Verdict::Retry { at_least, cause } = verdict else {
            return None;
        };
        if !self.keyed {
            return None;
        }
        let attempts = self.attempts;
        let config = &self.policy.config;
        if attempts >= config.max_attempts {
            tracing::debug!(target: TARGET, attempts, cause, "no retry: attempts used up");
            return None;
        }
        let wait = at_least.max(full_jitter(
            &mut self.rng,
            config.base_delay,
            config.max_delay,
            attempts,
        ));
        if self.started.elapsed() + wait >= config.deadline {
            tracing::debug!(target: TARGET, attempts, ?wait, cause, "no retry: the deadline would pass");
            return None;
        }
        if !self.policy.budget.withdraw() {
            observe::budget_refusal();
            tracing::warn!(target: TARGET, attempts, cause, "no retry: the retry budget is spent");
            return None;
        }
        observe::retry(cause);
        tracing::info!(target: TARGET, attempts, ?wait, cause, "retrying with the same key");
        Some(wait)
    }
}

/// A random wait in `[0, min(max, base * 2^(retry - 1))]` ("full jitter"), so clients that failed
/// together do not retry together. The randomness is tower's (`tower::util::rng`), as its own
/// backoff uses.
fn full_jitter(rng: &mut impl Rng, base: Duration, max: Duration, retry: u32) -> Duration {
    let exponent = retry.saturating_sub(1).min(31);
    let ceiling = base.saturating_mul(1 << exponent).min(max);
    ceiling.mul_f64(rng.next_f64().clamp(0.0, 1.0))
}

/// The counters (feature `metrics`): attempts, retries by cause, budget refusals.
mod observe {
    /// Attempts sent, first ones included.
    #[cfg(feature = "metrics")]
    pub(super) const ATTEMPTS: &str = "idempotency_client_attempts_total";
    /// Retries, labelled by `cause`.
    #[cfg(feature = "metrics")]
    pub(super) const RETRIES: &str = "idempotency_client_retries_total";
    /// Retries the budget refused.
    #[cfg(feature = "metrics")]
    pub(super) const BUDGET_REFUSALS: &str = "idempotency_client_budget_refusals_total";

    pub(super) fn attempt() {
        #[cfg(feature = "metrics")]
        metrics::counter!(ATTEMPTS).increment(1);
    }

    pub(super) fn retry(_cause: &'static str) {
        #[cfg(feature = "metrics")]
        metrics::counter!(RETRIES, "cause" => _cause).increment(1);
    }

    pub(super) fn budget_refusal() {
        #[cfg(feature = "metrics")]
        metrics::counter!(BUDGET_REFUSALS).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient() -> Verdict {
        Verdict::retry(Duration::ZERO, "transport")
    }

    #[test]
    fn full_jitter_stays_under_the_capped_exponential() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let mut rng = HasherRng::default();
        let mut seen_below_half = false;
        for retry in 1..40 {
            let ceiling = (base * 2u32.pow(retry.min(20) - 1)).min(max);
            for _ in 0..50 {
                let wait = full_jitter(&mut rng, base, max, retry);
                assert!(wait <= ceiling);
                seen_below_half |= wait < ceiling / 2;
            }
        }
        assert!(seen_below_half, "full jitter spreads over the whole range");
    }

    #[tokio::test]
    async fn an_unkeyed_intent_is_never_retried() {
        let policy = Policy::new(RetryConfig::default()).unwrap();
        let mut intent = policy.start(false);
        intent.begin_attempt();
        assert_eq!(intent.retry_after(transient()), None);
        let mut keyed = policy.start(true);
        keyed.begin_attempt();
        assert!(keyed.retry_after(transient()).is_some());
        assert_eq!(keyed.retry_after(Verdict::Final), None);
    }

    #[tokio::test]
    async fn attempts_stop_at_the_maximum() {
        let config = RetryConfig::default()
            .with_max_attempts(3)
            .with_backoff(Duration::ZERO, Duration::ZERO);
        let mut intent = Policy::new(config).unwrap().start(true);
        let mut attempts = 1;
        intent.begin_attempt();
        while intent.retry_after(transient()).is_some() {
            intent.begin_attempt();
            attempts += 1;
        }
        assert_eq!(attempts, 3);
    }

    /// The counters, read through a recorder of the test's own.
    #[cfg(feature = "metrics")]
    #[test]
    fn attempts_retries_by_cause_and_budget_refusals_are_counted() {
        use std::{
            collections::BTreeMap,
            sync::{atomic::AtomicU64, atomic::Ordering, Mutex},
        };

        use metrics::{Counter, CounterFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};

        #[derive(Default)]
        struct Counters(Mutex<BTreeMap<String, Arc<AtomicU64>>>);
        struct Handle(Arc<AtomicU64>);
        impl CounterFn for Handle {
            fn increment(&self, value: u64) {
                self.0.fetch_add(value, Ordering::SeqCst);
            }
            fn absolute(&self, value: u64) {
                self.0.store(value, Ordering::SeqCst);
            }
        }
        impl Recorder for Counters {
            fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
            fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
            fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
            fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
                let labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                let name = format!("{}{{{}}}", key.name(), labels.join(","));
                let cell = self.0.lock().unwrap().entry(name).or_default().clone();
                Counter::from_arc(Arc::new(Handle(cell)))
            }
            fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
                metrics::Gauge::noop()
            }
            fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> metrics::Histogram {
                metrics::Histogram::noop()
            }
        }

        let counters = Counters::default();
        metrics::with_local_recorder(&counters, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let config = RetryConfig::default().with_backoff(Duration::ZERO, Duration::ZERO);
                let mut intent = Policy::new(config).unwrap().start(true);
                intent.begin_attempt();
                assert!(intent
                    .retry_after(Verdict::retry(Duration::ZERO, "unavailable"))
                    .is_some());
                intent.begin_attempt();
                assert!(intent.retry_after(transient()).is_some());
                intent.begin_attempt();
                // No budget at all: the retry is refused and counted as such.
                let spent = Arc::new(tower::retry::budget::TpsBudget::new(
                    Duration::from_secs(1),
                    0,
                    0.0,
                ));
                let config = RetryConfig::default().with_shared_budget(spent);
                let mut refused = Policy::new(config).unwrap().start(true);
                refused.begin_attempt();
                assert_eq!(refused.retry_after(transient()), None);
            });
        });
        let read = |name: &str| {
            counters
                .0
                .lock()
                .unwrap()
                .get(name)
                .map(|c| c.load(Ordering::SeqCst))
                .unwrap_or(0)
        };
        assert_eq!(read("idempotency_client_attempts_total{}"), 4);
        assert_eq!(
            read("idempotency_client_retries_total{cause=unavailable}"),
            1
        );
        assert_eq!(read("idempotency_client_retries_total{cause=transport}"), 1);
        assert_eq!(read("idempotency_client_budget_refusals_total{}"), 1);
    }

    #[tokio::test]
    async fn a_retry_after_beyond_the_deadline_stops() {
        let config = RetryConfig::default().with_deadline(Duration::from_secs(5));
        let mut intent = Policy::new(config).unwrap().start(true);
        intent.begin_attempt();
        let verdict = Verdict::retry(Duration::from_secs(60), "unavailable");
        assert_eq!(intent.retry_after(verdict), None);
    }
}
