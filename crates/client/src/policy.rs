//! The retry core both front ends run: one intent's attempts, the decision after each, the
//! backoff, and what is counted.
//!
//! The tower service and the reqwest middleware differ only in how they send one attempt and
//! read its result ([`Attempt`]); [`drive`] runs them in backon's retry loop.

use std::{future::Future, sync::Arc, time::Duration};

use backon::{ExponentialBuilder, Retryable};
use http::{HeaderMap, HeaderValue, Method};
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

    /// The key of the intent `headers` begin, added to them when the key rules make one (see
    /// [`KeyRules::ensure_key`](crate::key::KeyRules::ensure_key)).
    pub(crate) fn ensure_key(
        &self,
        method: &Method,
        headers: &mut HeaderMap,
    ) -> Option<HeaderValue> {
        self.config.keys.ensure_key(method, headers)
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

/// A retryable attempt's result, on its way through backon's retry loop.
struct Retrying<R, E> {
    ended: Ended<R, E>,
    at_least: Duration,
    cause: &'static str,
}

/// Send attempts until one may not be retried; returns how it ended and the attempts sent.
///
/// The loop is backon's: its exponential schedule (from the base delay, doubling, capped, at
/// most `max_attempts - 1` retries) and its sleeps. [`Intent::next_wait`] adjusts each wait:
/// full jitter, at least the server's `Retry-After`, within the deadline and the budget.
pub(crate) async fn drive<A>(intent: Intent, attempt: A) -> (Ended<A::Response, A::Error>, u32)
where
    A: Attempt + Send,
    A::Response: Send,
    A::Error: Send,
{
    let config = intent.policy.config.clone();
    let schedule = ExponentialBuilder::new()
        .with_min_delay(config.base_delay)
        .with_max_delay(config.max_delay)
        .with_factor(2.0)
        .with_max_times(config.max_attempts.saturating_sub(1) as usize);
    // One attempt at a time: the locks are never contended, they only let backon's `FnMut`
    // hand out futures that use the attempt and the intent.
    let intent = std::sync::Mutex::new(intent);
    let attempt = tokio::sync::Mutex::new(attempt);
    let (intent_ref, attempt_ref, config) = (&intent, &attempt, &*config);
    let send_one = move || async move {
        let mut attempt = attempt_ref.lock().await;
        let (timeout, keyed) = {
            let mut intent = intent_ref.lock().expect("no attempt panics holding it");
            (intent.begin_attempt(), intent.keyed)
        };
        let (verdict, ended) = match tokio::time::timeout(timeout, attempt.send()).await {
            Ok(result) => (attempt.classify(&result), Ended::Result(result)),
            Err(_) => (config.classifier.timed_out(), Ended::TimedOut { timeout }),
        };
        match verdict {
            // Only a keyed intent may be retried, whatever the classifier says.
            Verdict::Retry { at_least, cause } if keyed => Err(Retrying {
                ended,
                at_least,
                cause,
            }),
            _ => Ok(ended),
        }
    };
    let finished = send_one
        .retry(schedule)
        .sleep(tokio::time::sleep)
        .adjust(|retrying, scheduled| {
            intent_ref
                .lock()
                .expect("no attempt panics holding it")
                .next_wait(retrying.at_least, retrying.cause, scheduled)
        })
        .await;
    let ended = match finished {
        Ok(ended) => ended,
        Err(retrying) => retrying.ended,
    };
    let attempts = intent
        .into_inner()
        .expect("no attempt panics holding it")
        .attempts;
    (ended, attempts)
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

    /// The wait before the next attempt of a retryable one, or `None` to stop and hand its
    /// result back. `scheduled` is backon's next exponential delay (`None`: attempts used up);
    /// the wait is a random share of it (full jitter), at least `at_least` (`Retry-After`).
    fn next_wait(
        &mut self,
        at_least: Duration,
        cause: &'static str,
        scheduled: Option<Duration>,
    ) -> Option<Duration> {
        let attempts = self.attempts;
        let Some(scheduled) = scheduled else {
            tracing::debug!(target: TARGET, attempts, cause, "no retry: attempts used up");
            return None;
        };
        let wait = at_least.max(full_jitter(&mut self.rng, scheduled));
        let config = &self.policy.config;
        // Saturating: a server may ask for any `Retry-After`, up to `u64::MAX` seconds.
        if self.started.elapsed().saturating_add(wait) >= config.deadline {
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

/// A random wait in `[0, ceiling]` ("full jitter"), so clients that failed together do not
/// retry together. The randomness is tower's (`tower::util::rng`, as its own backoff uses).
fn full_jitter(rng: &mut impl Rng, ceiling: Duration) -> Duration {
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

    /// A retry of a transport error, with backon's next delay `scheduled`.
    fn transient(intent: &mut Intent, scheduled: Option<Duration>) -> Option<Duration> {
        intent.next_wait(Duration::ZERO, "transport", scheduled)
    }

    /// The waits a retry takes (not only the jitter function) spread over the whole range
    /// below backon's delay: with no jitter every wait would be the delay itself.
    #[test]
    fn retry_waits_spread_over_the_whole_range_below_the_delay() {
        let ceiling = Duration::from_millis(800);
        let config = RetryConfig::default().with_budget(Duration::from_secs(10), 1_000, 1.0);
        let policy = Policy::new(config).unwrap();
        let mut intent = policy.start(true);
        let waits: Vec<_> = (0..200)
            .map(|_| transient(&mut intent, Some(ceiling)).expect("a retry within the budget"))
            .collect();
        assert!(waits.iter().all(|wait| *wait <= ceiling));
        assert!(waits.iter().any(|wait| *wait < ceiling / 4));
        assert!(waits.iter().any(|wait| *wait > ceiling * 3 / 4));
    }

    #[tokio::test]
    async fn a_retry_waits_at_least_retry_after_and_stops_when_attempts_are_used_up() {
        let policy = Policy::new(RetryConfig::default()).unwrap();
        let mut intent = policy.start(true);
        intent.begin_attempt();
        let wait = intent.next_wait(
            Duration::from_secs(2),
            "in_flight",
            Some(Duration::from_millis(100)),
        );
        assert_eq!(wait, Some(Duration::from_secs(2)));
        let wait = transient(&mut intent, Some(Duration::from_millis(100))).unwrap();
        assert!(wait <= Duration::from_millis(100));
        assert_eq!(
            transient(&mut intent, None),
            None,
            "backon's schedule is used up"
        );
    }

    /// A `Retry-After` of `u64::MAX` seconds (a server's, or a proxy's) ends the intent with the
    /// answer it came with: the deadline would pass. Added to the time the intent has taken (a
    /// second and a half here, on tokio's paused clock), it must not overflow into a panic.
    #[tokio::test(start_paused = true)]
    async fn the_longest_retry_after_stops_the_retries() {
        let policy = Policy::new(RetryConfig::default()).unwrap();
        let mut intent = policy.start(true);
        intent.begin_attempt();
        tokio::time::advance(Duration::from_millis(1_500)).await;
        let longest = Duration::from_secs(u64::MAX);
        let wait = intent.next_wait(longest, "unavailable", Some(Duration::from_millis(100)));
        assert_eq!(wait, None);
    }

    /// The whole loop, through backon, with an attempt that fails until it is told otherwise.
    struct Flaky {
        failures_left: u32,
        keyed: bool,
    }

    impl Attempt for Flaky {
        type Response = u32;
        type Error = &'static str;

        fn send(&mut self) -> impl Future<Output = Result<u32, &'static str>> + Send + '_ {
            let failed = self.failures_left > 0;
            self.failures_left = self.failures_left.saturating_sub(1);
            async move {
                if failed {
                    Err("connection reset")
                } else {
                    Ok(201)
                }
            }
        }

        fn classify(&self, result: &Result<u32, &'static str>) -> Verdict {
            match result {
                Ok(_) => Verdict::Final,
                Err(_) => Verdict::retry(Duration::ZERO, "transport"),
            }
        }
    }

    #[tokio::test]
    async fn drive_retries_until_an_answer_and_counts_the_attempts() {
        let config = RetryConfig::default()
            .with_max_attempts(5)
            .with_backoff(Duration::ZERO, Duration::from_millis(1));
        let policy = Policy::new(config).unwrap();
        let flaky = Flaky {
            failures_left: 2,
            keyed: true,
        };
        let (ended, attempts) = drive(policy.start(flaky.keyed), flaky).await;
        assert!(matches!(ended, Ended::Result(Ok(201))), "{ended:?}");
        assert_eq!(attempts, 3);

        let always = Flaky {
            failures_left: 10,
            keyed: true,
        };
        let (ended, attempts) = drive(policy.start(always.keyed), always).await;
        assert!(
            matches!(ended, Ended::Result(Err("connection reset"))),
            "{ended:?}"
        );
        assert_eq!(attempts, 5, "max attempts");

        let unkeyed = Flaky {
            failures_left: 1,
            keyed: false,
        };
        let (ended, attempts) = drive(policy.start(unkeyed.keyed), unkeyed).await;
        assert!(matches!(ended, Ended::Result(Err(_))), "{ended:?}");
        assert_eq!(attempts, 1, "an unkeyed intent is sent once");
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
                let scheduled = Some(Duration::ZERO);
                assert!(intent
                    .next_wait(Duration::ZERO, "unavailable", scheduled)
                    .is_some());
                intent.begin_attempt();
                assert!(transient(&mut intent, scheduled).is_some());
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
                assert_eq!(transient(&mut refused, Some(Duration::ZERO)), None);
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
        let wait = intent.next_wait(Duration::from_secs(60), "unavailable", Some(Duration::ZERO));
        assert_eq!(wait, None);
    }
}
