//! Tracing events and metrics.
//!
//! Events are emitted under the target `tower_idempotency`, inside a span named `idempotency`
//! per guarded request. The span carries the scoped key hash (`idempotency.key_hash`, 64 hex
//! digits as the operator tools take them; never the raw key, the scope or the body), the
//! OpenTelemetry HTTP fields `http.request.method`, `http.route`, `url.path` and
//! `http.response.status_code`, and the request's final `outcome`.
//!
//! `http.route` is the route that matched, such as `/orders/{id}`: axum's `MatchedPath` (with the
//! `axum` feature, under `route_layer` or a layer on the route), else [`UNKNOWN_ROUTE`]. Metrics
//! carry the route, never the raw path, so their label values stay as few as the routes.
//!
//! Every guarded request (a covered method) ends in exactly one final outcome, counted once in
//! `idempotency_requests_total{outcome, http.route}` (with the `metrics` feature; Prometheus
//! shows the label as `http_route`), so the counter sums to the guarded requests:
//!
//! | outcome | meaning | level |
//! |---|---|---|
//! | `saved` | the handler ran; its answer was saved | debug |
//! | `released` | the handler ran; the key was released (not-saved status, inner error, panic) | info |
//! | `fenced_out` | the handler ran but lost its lease first: its answer was not saved | warn |
//! | `replayed` | a saved answer was replayed | debug |
//! | `in_flight` | 409: the first attempt is still running | info |
//! | `mismatch` | 422: the key was used for a different request | warn |
//! | `rejected` | 400 or 413: no valid key, or the body is over the limit or unreadable | info |
//! | `no_key` | no key, and the layer is [`optional`](crate::Idempotency::optional): passed through | debug |
//! | `store_error` | the store failed: 503 (or the answer could not be saved) | error |
//! | `fail_open` | the store failed and the handler ran unguarded | warn |
//! | `cancelled` | the client went away before the layer decided anything | debug |
//!
//! Steps on the way are events only: `claimed`, `taken_over` (warn: a dead holder's lease was
//! taken over), `waited`, and the heartbeat's renewals and failures.
//!
//! Also with `metrics`: `idempotency_store_duration_seconds{op,store}`, a histogram of store
//! operation latency (`op` = `claim`, `renew`, `complete`, `release`, `sweep`; `store` =
//! [`Store::name`](crate::store::Store::name)), `idempotency_lease_renewals_total`,
//! `idempotency_takeovers_total{http.route}` (a holder stopped renewing: its process died or lost
//! the store), and the sweeper's `idempotency_swept_records_total{store}`,
//! `idempotency_sweep_rounds_total{store,result}` and `idempotency_sweep_round_batches{store}`
//! (1 while it keeps up). The repository ships a Grafana dashboard and Prometheus alerts built
//! on them (`observability/`). Call
//! [`describe_metrics`](crate::describe_metrics) once at start-up to register units and help
//! texts with the recorder.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
};

use crate::key::KeyHash;

/// The `http.route` of a request whose matched route is not known (no axum `MatchedPath` in its
/// extensions).
pub const UNKNOWN_ROUTE: &str = "unknown";

/// The route that matched `request`, for spans and metrics: axum's `MatchedPath` when there is
/// one, else [`UNKNOWN_ROUTE`]. Never the raw path, whose values are unbounded.
pub(crate) fn route_of<B>(request: &http::Request<B>) -> Route {
    #[cfg(feature = "axum")]
    if let Some(matched) = request.extensions().get::<axum::extract::MatchedPath>() {
        return Route::Matched(matched.clone());
    }
    let _ = request;
    Route::Unknown
}

/// A request's `http.route`. Axum's `MatchedPath` is kept as it is (a reference count), not
/// copied into a new string for every request.
#[derive(Clone)]
pub(crate) enum Route {
    /// [`UNKNOWN_ROUTE`].
    Unknown,
    #[cfg(feature = "axum")]
    Matched(axum::extract::MatchedPath),
}

impl Route {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Route::Unknown => UNKNOWN_ROUTE,
            #[cfg(feature = "axum")]
            Route::Matched(matched) => matched.as_str(),
        }
    }
}

/// The names of this crate's metrics, and what [`describe_metrics`] registers for each.
#[cfg(feature = "metrics")]
mod metric {
    use metrics::Unit;

    /// The counter of final outcomes.
    pub(crate) const REQUESTS_TOTAL: &str = "idempotency_requests_total";
    /// The histogram of store operation latency.
    pub(crate) const STORE_DURATION: &str = "idempotency_store_duration_seconds";
    /// The counter of lease renewals.
    pub(crate) const LEASE_RENEWALS_TOTAL: &str = "idempotency_lease_renewals_total";
    /// The counter of takeovers: running records whose holder stopped renewing (died, or lost the
    /// store for a whole lease), claimed again by a retry.
    pub(crate) const TAKEOVERS_TOTAL: &str = "idempotency_takeovers_total";
    /// The counter of expired records the sweeper deleted.
    pub(crate) const SWEPT_TOTAL: &str = "idempotency_swept_records_total";
    /// The counter of sweeper rounds, by result (`ok`, `error`).
    pub(crate) const SWEEP_ROUNDS_TOTAL: &str = "idempotency_sweep_rounds_total";
    /// The gauge of batches the last sweeper round needed: 1 when it keeps up, more while it works
    /// through a backlog.
    pub(crate) const SWEEP_ROUND_BATCHES: &str = "idempotency_sweep_round_batches";
    /// The gauge of stored records by `state` (`running`, `done`, `expired`), read by a
    /// [`Sweeper::spawn_with_stats`](crate::Sweeper::spawn_with_stats) round.
    pub(crate) const RECORDS: &str = "idempotency_records";
    /// The gauge of the age of the oldest running record (0 when none runs): a handler that hangs
    /// while its heartbeat keeps the lease shows here, and nowhere else.
    pub(crate) const OLDEST_RUNNING: &str = "idempotency_oldest_running_seconds";

    /// How a metric is recorded.
    pub(super) enum Kind {
        Counter,
        Histogram,
        Gauge,
    }

    /// Each metric: its name, kind, unit and help text, one row a metric.
    pub(super) const DESCRIPTIONS: [(&str, Kind, Unit, &str); 9] = [
        (REQUESTS_TOTAL, Kind::Counter, Unit::Count, "Requests guarded by the idempotency layer, by final outcome and matched route (sums to the guarded requests)."),
        (STORE_DURATION, Kind::Histogram, Unit::Seconds, "Latency of idempotency store operations, by operation and store."),
        (LEASE_RENEWALS_TOTAL, Kind::Counter, Unit::Count, "Lease renewals by the heartbeat of running attempts."),
        (TAKEOVERS_TOTAL, Kind::Counter, Unit::Count, "Running records whose holder stopped renewing its lease, claimed again by a retry, by matched route."),
        (SWEPT_TOTAL, Kind::Counter, Unit::Count, "Expired idempotency records deleted by the sweeper, by store."),
        (SWEEP_ROUNDS_TOTAL, Kind::Counter, Unit::Count, "Sweeper rounds, by store and result (ok, error)."),
        (SWEEP_ROUND_BATCHES, Kind::Gauge, Unit::Count, "Batches the last sweeper round needed: 1 when it keeps up, more while a backlog clears."),
        (RECORDS, Kind::Gauge, Unit::Count, "Stored idempotency records by store and state (running, done, expired not yet swept), as of the last Sweeper::spawn_with_stats round."),
        (OLDEST_RUNNING, Kind::Gauge, Unit::Seconds, "Age of the oldest running idempotency record by store (0 when none runs), as of the last Sweeper::spawn_with_stats round."),
    ];
}
#[cfg(feature = "metrics")]
use metric::{
    LEASE_RENEWALS_TOTAL, OLDEST_RUNNING, RECORDS, REQUESTS_TOTAL, STORE_DURATION,
    SWEEP_ROUNDS_TOTAL, SWEEP_ROUND_BATCHES, SWEPT_TOTAL, TAKEOVERS_TOTAL,
};

/// What happened to one request (or one step of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Claimed,
    TakenOver,
    Replayed,
    InFlight,
    Waited,
    Mismatch,
    Saved,
    Released,
    FencedOut,
    StoreError,
    FailOpen,
    Rejected,
    NoKey,
    Cancelled,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Claimed => "claimed",
            Outcome::TakenOver => "taken_over",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::Waited => "waited",
            Outcome::Mismatch => "mismatch",
            Outcome::Saved => "saved",
            Outcome::Released => "released",
            Outcome::FencedOut => "fenced_out",
            Outcome::StoreError => "store_error",
            Outcome::FailOpen => "fail_open",
            Outcome::Rejected => "rejected",
            Outcome::NoKey => "no_key",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Log `outcome` as one tracing event at the level the table gives. Counts nothing: the
/// request's final outcome is counted once, by [`RequestRecord`].
pub(crate) fn record(outcome: Outcome, detail: &dyn std::fmt::Display) {
    let name = outcome.as_str();
    match outcome {
        Outcome::Claimed
        | Outcome::Replayed
        | Outcome::Waited
        | Outcome::Saved
        | Outcome::NoKey
        | Outcome::Cancelled => {
            tracing::debug!(target: "tower_idempotency", outcome = name, "{detail}")
        }
        Outcome::InFlight | Outcome::Released | Outcome::Rejected => {
            tracing::info!(target: "tower_idempotency", outcome = name, "{detail}")
        }
        Outcome::TakenOver | Outcome::Mismatch | Outcome::FencedOut | Outcome::FailOpen => {
            tracing::warn!(target: "tower_idempotency", outcome = name, "{detail}")
        }
        Outcome::StoreError => {
            tracing::error!(target: "tower_idempotency", outcome = name, "{detail}")
        }
    }
}

/// One guarded request: its span, and its final outcome, counted once when the last holder
/// (the request's future, or the attempt finishing after the client left) drops it.
pub(crate) struct RequestRecord {
    span: tracing::Span,
    outcome: OnceLock<Outcome>,
    route: Route,
    /// Set when the claimed run begins: the runtime its flow is handed to if the response future
    /// is dropped.
    runtime: OnceLock<tokio::runtime::Handle>,
}

impl RequestRecord {
    pub(crate) fn new(method: &http::Method, path: &str, route: Route) -> Arc<Self> {
        let span = tracing::info_span!(
            target: "tower_idempotency",
            "idempotency",
            "http.request.method" = %method,
            "http.route" = route.as_str(),
            "url.path" = path,
            "idempotency.key_hash" = tracing::field::Empty,
            "http.response.status_code" = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // A span the subscriber does not want still costs its `log` fallback checks on every
        // enter, exit and record when `tracing`'s `log` feature is on (sqlx turns it on). With a
        // subscriber set that fallback never writes, so the span is dropped for none; without
        // one, `log` may be all the application reads, and the span stays.
        let span = if span.is_disabled() && tracing::dispatcher::has_been_set() {
            tracing::Span::none()
        } else {
            span
        };
        Arc::new(Self {
            span,
            outcome: OnceLock::new(),
            route,
            runtime: OnceLock::new(),
        })
    }

    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The matched route, as in the span.
    pub(crate) fn route(&self) -> &str {
        self.route.as_str()
    }

    /// The claimed run begins: from now on a dropped response future finishes it on this runtime.
    pub(crate) fn finish_on_drop(&self) {
        let _ = self.runtime.set(tokio::runtime::Handle::current());
    }

    /// The runtime a dropped response future hands its claimed run to, once the run has begun.
    pub(crate) fn runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.runtime.get()
    }

    pub(crate) fn key(&self, key: &KeyHash) {
        // All 64 hex digits, as the admin CLI and routes take them; formatted only if a
        // subscriber records the span.
        self.span
            .record("idempotency.key_hash", tracing::field::display(key));
    }

    pub(crate) fn status(&self, status: http::StatusCode) {
        self.span
            .record("http.response.status_code", status.as_u16());
    }

    /// Log `outcome`, and make it the request's final outcome unless one was set before (the
    /// first decision wins: a failed commit stays `store_error` when the key is then released).
    pub(crate) fn finish(&self, outcome: Outcome, detail: &dyn std::fmt::Display) {
        record(outcome, detail);
        if self.outcome.set(outcome).is_ok() {
            self.span.record("outcome", outcome.as_str());
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        let outcome = self.outcome.get().copied().unwrap_or(Outcome::Cancelled);
        if self.outcome.get().is_none() {
            self.span.record("outcome", outcome.as_str());
        }
        #[cfg(feature = "metrics")]
        metrics::counter!(
            REQUESTS_TOTAL,
            "outcome" => outcome.as_str(),
            "http.route" => self.route.as_str().to_owned()
        )
        .increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }
}

/// Run one store operation, timing it into `idempotency_store_duration_seconds{op,store}`.
///
/// A combinator rather than an `async fn`, which would keep `work` twice in its state.
#[cfg(feature = "metrics")]
pub(crate) fn timed<F: Future>(store: &'static str, op: &'static str, work: F) -> Timed<F> {
    Timed {
        work,
        store,
        op,
        started: None,
    }
}

/// Run one store operation (timed only with the `metrics` feature).
#[cfg(not(feature = "metrics"))]
pub(crate) fn timed<F: Future>(store: &'static str, op: &'static str, work: F) -> F {
    let _ = (store, op);
    work
}

#[cfg(feature = "metrics")]
pin_project_lite::pin_project! {
    /// The future of [`timed`]: the clock starts at the first poll, as the operation does.
    pub(crate) struct Timed<F> {
        #[pin]
        work: F,
        store: &'static str,
        op: &'static str,
        started: Option<std::time::Instant>,
    }
}

#[cfg(feature = "metrics")]
impl<F: Future> Future for Timed<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        let started = *this.started.get_or_insert_with(std::time::Instant::now);
        let output = std::task::ready!(this.work.poll(cx));
        metrics::histogram!(STORE_DURATION, "op" => *this.op, "store" => *this.store)
            .record(started.elapsed().as_secs_f64());
        std::task::Poll::Ready(output)
    }
}

/// Register the units and help texts of this crate's metrics with the installed `metrics`
/// recorder (Prometheus `# HELP` lines, for one). Call once, after installing the recorder.
///
/// ```
/// tower_idempotency::describe_metrics();
/// ```
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metric::Kind;
    for (name, kind, unit, help) in metric::DESCRIPTIONS {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, unit, help),
            Kind::Histogram => metrics::describe_histogram!(name, unit, help),
            Kind::Gauge => metrics::describe_gauge!(name, unit, help),
        }
    }
}

/// `, grpc-status N` when the answer carries one, for the log line of a released key.
pub(crate) fn grpc_status_note(headers: &http::HeaderMap, trailers: &http::HeaderMap) -> String {
    trailers
        .get("grpc-status")
        .or_else(|| headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(|code| format!(", grpc-status {code}"))
        .unwrap_or_default()
}

/// An error and its sources, `a: b: c`, for log lines (a store error's own text says only what
/// kind of failure it was; the cause is in its source).
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

/// Count one lease renewal.
pub(crate) fn renewed() {
    #[cfg(feature = "metrics")]
    metrics::counter!(LEASE_RENEWALS_TOTAL).increment(1);
}

/// Count one takeover of a lapsed lease.
pub(crate) fn taken_over(route: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(TAKEOVERS_TOTAL, "http.route" => route.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = route;
}

/// Count one sweeper round: `deleted` records in `batches` statements, or a failure.
pub(crate) fn swept(store: &'static str, deleted: u64, batches: u64, failed: bool) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(SWEPT_TOTAL, "store" => store).increment(deleted);
        let result = if failed { "error" } else { "ok" };
        metrics::counter!(SWEEP_ROUNDS_TOTAL, "store" => store, "result" => result).increment(1);
        metrics::gauge!(SWEEP_ROUND_BATCHES, "store" => store).set(batches as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (store, deleted, batches, failed);
}

/// Set the record gauges from one [`Store::stats`](crate::store::Store::stats) reading.
pub(crate) fn store_stats(store: &'static str, stats: &crate::store::StoreStats) {
    #[cfg(feature = "metrics")]
    {
        for (state, count) in [
            ("running", stats.running),
            ("done", stats.done),
            ("expired", stats.expired),
        ] {
            metrics::gauge!(RECORDS, "store" => store, "state" => state).set(count as f64);
        }
        let oldest = stats.oldest_running.map_or(0.0, |o| o.age.as_secs_f64());
        metrics::gauge!(OLDEST_RUNNING, "store" => store).set(oldest);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (store, stats);
}

/// A metrics recorder for the crate's tests: every counter, the sample count of every
/// histogram, and every value set on a gauge, by name and labels (`name{label=value,..}`). Its
/// tests run on the memory store.
#[cfg(all(test, feature = "metrics", feature = "memory"))]
pub(crate) mod recorded {
    use std::{
        collections::BTreeMap,
        sync::{
            atomic::{AtomicU64, Ordering},
            Arc, Mutex,
        },
    };

    use metrics::{Key, KeyName, Metadata, SharedString, Unit};

    #[derive(Default)]
    pub(crate) struct Recorded {
        samples: Mutex<BTreeMap<String, Arc<Samples>>>,
        gauges: Arc<Mutex<Vec<(String, f64)>>>,
    }

    #[derive(Default)]
    struct Samples(AtomicU64);

    /// One gauge: its values go to the recorder's list, in the order they are set.
    struct Gauge(Arc<Mutex<Vec<(String, f64)>>>, String);

    fn name(key: &Key) -> String {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }

    impl Recorded {
        fn samples(&self, key: &Key) -> Arc<Samples> {
            let mut samples = self.samples.lock().unwrap();
            samples.entry(name(key)).or_default().clone()
        }

        /// The count of the counter or histogram `name` (0 if never touched).
        pub(crate) fn get(&self, name: &str) -> u64 {
            let samples = self.samples.lock().unwrap();
            samples.get(name).map_or(0, |s| s.0.load(Ordering::SeqCst))
        }

        /// The counts of every counter and histogram whose name starts with `prefix`, summed.
        pub(crate) fn sum(&self, prefix: &str) -> u64 {
            let samples = self.samples.lock().unwrap();
            samples
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, s)| s.0.load(Ordering::SeqCst))
                .sum()
        }

        /// Every value set on a gauge so far, in order.
        pub(crate) fn gauges(&self) -> Vec<(String, f64)> {
            self.gauges.lock().unwrap().clone()
        }
    }

    impl metrics::CounterFn for Samples {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::SeqCst);
        }
        fn absolute(&self, value: u64) {
            self.0.store(value, Ordering::SeqCst);
        }
    }

    impl metrics::HistogramFn for Samples {
        fn record(&self, _: f64) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl metrics::GaugeFn for Gauge {
        fn increment(&self, _: f64) {}
        fn decrement(&self, _: f64) {}
        fn set(&self, value: f64) {
            self.0.lock().unwrap().push((self.1.clone(), value));
        }
    }

    impl metrics::Recorder for Recorded {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
            metrics::Counter::from_arc(self.samples(key))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::from_arc(Arc::new(Gauge(self.gauges.clone(), name(key))))
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::from_arc(self.samples(key))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreError, StoreErrorKind};

    #[test]
    fn log_lines_carry_the_cause_of_a_store_error() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let err = StoreError::new(StoreErrorKind::Unavailable, io);
        assert_eq!(
            Chain(&err).to_string(),
            "idempotency store unavailable: connection refused"
        );
    }

    /// Every metric the crate records is described once, as the kind it is recorded as.
    #[cfg(feature = "metrics")]
    #[test]
    fn describe_metrics_describes_each_metric_as_its_kind() {
        use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, SharedString, Unit};
        use std::sync::Mutex;

        #[derive(Default)]
        struct Descriptions(Mutex<Vec<(&'static str, String, Option<Unit>)>>);
        impl Descriptions {
            fn push(&self, kind: &'static str, key: KeyName, unit: Option<Unit>) {
                let entry = (kind, key.as_str().to_owned(), unit);
                self.0.lock().unwrap().push(entry);
            }
        }
        impl metrics::Recorder for Descriptions {
            fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
                self.push("counter", key, unit);
            }
            fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
                self.push("gauge", key, unit);
            }
            fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
                self.push("histogram", key, unit);
            }
            fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
                Counter::noop()
            }
            fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
                Gauge::noop()
            }
            fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
                Histogram::noop()
            }
        }

        let recorder = Descriptions::default();
        metrics::with_local_recorder(&recorder, describe_metrics);
        let mut described = recorder.0.into_inner().unwrap();
        described.sort_by(|a, b| a.1.cmp(&b.1));
        let expected = [
            ("counter", LEASE_RENEWALS_TOTAL, Unit::Count),
            ("gauge", OLDEST_RUNNING, Unit::Seconds),
            ("gauge", RECORDS, Unit::Count),
            ("counter", REQUESTS_TOTAL, Unit::Count),
            ("histogram", STORE_DURATION, Unit::Seconds),
            ("gauge", SWEEP_ROUND_BATCHES, Unit::Count),
            ("counter", SWEEP_ROUNDS_TOTAL, Unit::Count),
            ("counter", SWEPT_TOTAL, Unit::Count),
            ("counter", TAKEOVERS_TOTAL, Unit::Count),
        ]
        .map(|(kind, name, unit)| (kind, name.to_owned(), Some(unit)));
        assert_eq!(described, expected);
    }
}
