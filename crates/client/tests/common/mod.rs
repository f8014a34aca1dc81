//! One suite of retry tests, run against each client adapter (the tower layer over hyper, and
//! the reqwest middleware) by the `suite!` macro.

#![allow(dead_code)]

pub mod server;

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use server::{Answer, Scripted};
use tower_idempotency_client::{
    Attempts, Classify, DefaultClassifier, KeyMode, RetryConfig, Verdict,
};

/// Runs once, after the first failed attempt (to bring a server up between two attempts).
pub type Hook = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Sits between the retry layer and the real client: counts attempts and runs the hook.
#[derive(Default)]
pub struct Probe {
    attempts: AtomicU32,
    after_first_error: Mutex<Option<Hook>>,
}

impl Probe {
    pub fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }

    pub fn count(&self) {
        self.attempts.fetch_add(1, Ordering::SeqCst);
    }

    pub async fn failed(&self) {
        let hook = self.after_first_error.lock().unwrap().take();
        if let Some(hook) = hook {
            hook().await;
        }
    }
}

/// What a client gave back for one intent.
#[derive(Debug)]
pub struct Answered {
    pub status: u16,
    pub attempts: Attempts,
}

/// A client adapter under test.
pub trait TestClient: Sized + Send + Sync + 'static {
    fn new(config: RetryConfig, probe: Arc<Probe>) -> Self;

    /// POST `{}` to `url`, with the caller's `key` if given; `Err` holds the error's text.
    fn post(
        &self,
        url: &str,
        key: Option<&str>,
    ) -> impl Future<Output = Result<Answered, String>> + Send;
}

/// Fast backoff, so that only `Retry-After` can make a test wait.
pub fn fast() -> RetryConfig {
    RetryConfig::default().with_backoff(Duration::from_millis(1), Duration::from_millis(2))
}

fn client<C: TestClient>(config: RetryConfig) -> (C, Arc<Probe>) {
    let probe = Arc::new(Probe::default());
    (C::new(config, probe.clone()), probe)
}

fn uuid(key: &Option<String>) -> uuid::Uuid {
    uuid::Uuid::parse_str(key.as_deref().expect("a key")).expect("a UUID")
}

pub async fn every_attempt_carries_the_same_key<C: TestClient>() {
    let server = Scripted::start(
        &[Answer::Status(503), Answer::Drop, Answer::Status(503)],
        Answer::Status(201),
    )
    .await;
    let (client, _) = client::<C>(fast());
    let answered = client.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.status, 201);
    assert_eq!(answered.attempts.count, 4);
    let keys = server.keys();
    assert_eq!(keys.len(), 4);
    assert_eq!(uuid(&keys[0]).get_version_num(), 4);
    assert!(keys.iter().all(|k| k == &keys[0]), "{keys:?}");
    assert_eq!(
        answered.attempts.key.unwrap().to_str().unwrap(),
        keys[0].as_deref().unwrap()
    );
}

pub async fn a_new_intent_gets_a_new_key<C: TestClient>() {
    let server = Scripted::start(&[Answer::Status(503)], Answer::Status(201)).await;
    let (client, _) = client::<C>(fast().with_key_mode(KeyMode::UuidV7));
    client.post(&server.url(), None).await.unwrap();
    client.post(&server.url(), None).await.unwrap();
    let keys = server.keys();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0], keys[1]);
    assert_ne!(keys[1], keys[2]);
    assert_eq!(uuid(&keys[2]).get_version_num(), 7);
}

pub async fn the_callers_key_is_reused<C: TestClient>() {
    let server = Scripted::start(&[Answer::Drop], Answer::Status(201)).await;
    let (client, _) = client::<C>(fast());
    let answered = client.post(&server.url(), Some("intent-7")).await.unwrap();
    assert_eq!(answered.status, 201);
    assert_eq!(
        server.keys(),
        vec![Some("intent-7".to_owned()), Some("intent-7".to_owned())]
    );
}

pub async fn retry_after_is_honoured<C: TestClient>() {
    let server = Scripted::start(
        &[Answer::RetryAfter(409, 1), Answer::RetryAfter(429, 1)],
        Answer::Status(201),
    )
    .await;
    let (client, _) = client::<C>(fast());
    let answered = client.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.status, 201);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for pair in seen.windows(2) {
        let waited = pair[1].at - pair[0].at;
        // The backoff alone is at most 2 ms: only Retry-After explains a full second.
        assert!(waited >= Duration::from_secs(1), "waited {waited:?}");
    }
}

pub async fn a_conflict_without_retry_after_is_not_retried<C: TestClient>() {
    let server = Scripted::start(&[], Answer::Status(409)).await;
    let (client, probe) = client::<C>(fast());
    assert_eq!(client.post(&server.url(), None).await.unwrap().status, 409);
    assert_eq!(probe.attempts(), 1);
}

pub async fn client_errors_and_500_are_not_retried<C: TestClient>() {
    for status in [400, 401, 404, 413, 422, 500] {
        let server = Scripted::start(&[], Answer::Status(status)).await;
        let (client, probe) = client::<C>(fast());
        let answered = client.post(&server.url(), None).await.unwrap();
        assert_eq!(answered.status, status);
        assert_eq!(answered.attempts.count, 1, "{status}");
        assert_eq!(probe.attempts(), 1, "{status}");
        assert_eq!(server.seen().len(), 1, "{status}");
    }
}

pub async fn unavailable_is_retried_up_to_max_attempts<C: TestClient>() {
    let server = Scripted::start(&[], Answer::Status(503)).await;
    let (client, probe) = client::<C>(fast().with_max_attempts(3));
    let answered = client.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.status, 503, "the last answer is handed back");
    assert_eq!(answered.attempts.count, 3);
    assert_eq!(probe.attempts(), 3);
    assert_eq!(server.seen().len(), 3);
}

pub async fn a_timeout_is_retried_with_the_same_key<C: TestClient>() {
    let server =
        Scripted::start(&[Answer::Hang(Duration::from_secs(5))], Answer::Status(201)).await;
    let (client, _) = client::<C>(fast().with_attempt_timeout(Duration::from_millis(200)));
    let answered = client.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.status, 201);
    assert_eq!(answered.attempts.count, 2);
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
}

pub async fn a_connect_error_is_retried<C: TestClient>() {
    let addr = server::free_port().await;
    let (client, probe) = client::<C>(fast());
    let started = Arc::new(Mutex::new(None));
    let slot = started.clone();
    *probe.after_first_error.lock().unwrap() = Some(Box::new(move || {
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            *slot.lock().unwrap() = Some(Scripted::serve(listener, &[], Answer::Status(201)));
        })
    }));
    let answered = client
        .post(&format!("http://{addr}/orders"), None)
        .await
        .unwrap();
    assert_eq!(answered.status, 201);
    assert_eq!(answered.attempts.count, 2);
    assert_eq!(probe.attempts(), 2);
    let server = started.lock().unwrap().take().expect("the hook ran");
    assert_eq!(server.seen().len(), 1, "the refused attempt never arrived");
}

pub async fn a_dead_server_costs_max_attempts<C: TestClient>() {
    let addr = server::free_port().await;
    let (client, probe) = client::<C>(fast().with_max_attempts(3));
    let err = client
        .post(&format!("http://{addr}/orders"), None)
        .await
        .unwrap_err();
    assert!(!err.is_empty());
    assert_eq!(probe.attempts(), 3);
}

pub async fn an_unkeyed_request_is_sent_once<C: TestClient>() {
    let server = Scripted::start(&[], Answer::Status(503)).await;
    let (client, probe) = client::<C>(fast().with_key_mode(KeyMode::CallerProvided));
    let answered = client.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.status, 503);
    assert_eq!(probe.attempts(), 1);
    assert_eq!(server.keys(), vec![None]);
}

pub async fn the_deadline_ends_the_retries<C: TestClient>() {
    let server = Scripted::start(&[], Answer::RetryAfter(503, 1)).await;
    let (client, _) = client::<C>(fast().with_deadline(Duration::from_millis(1500)));
    let answered = client.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.status, 503);
    // At 0 s, then at 1 s; a third at 2 s would pass the 1.5 s deadline.
    assert_eq!(server.seen().len(), 2);
}

/// Intents sent one after another to a server that always answers 503.
const STORM_INTENTS: u32 = 40;
const STORM_MAX_ATTEMPTS: u32 = 5;

async fn storm<C: TestClient>(config: RetryConfig) -> u32 {
    let server = Scripted::start(&[], Answer::Status(503)).await;
    let (client, probe) = client::<C>(config.with_max_attempts(STORM_MAX_ATTEMPTS));
    for _ in 0..STORM_INTENTS {
        assert_eq!(client.post(&server.url(), None).await.unwrap().status, 503);
    }
    assert_eq!(server.seen().len() as u32, probe.attempts());
    probe.attempts()
}

pub async fn the_budget_stops_a_retry_storm<C: TestClient>() {
    // A reserve of 1 retry/s over 10 s (10 retries) plus 1 retry per 10 intents.
    let budgeted = storm::<C>(fast().with_budget(Duration::from_secs(10), 1, 0.1)).await;
    let bound = STORM_INTENTS + 10 + STORM_INTENTS / 10;
    assert!(
        (STORM_INTENTS + 10..=bound).contains(&budgeted),
        "{budgeted} attempts, expected {} to {bound}",
        STORM_INTENTS + 10
    );
    // The same storm with room for every retry: the budget, not the script, held it back.
    let unbounded = storm::<C>(fast().with_budget(Duration::from_secs(10), 1000, 10.0)).await;
    assert_eq!(unbounded, STORM_INTENTS * STORM_MAX_ATTEMPTS);
}

/// Retries a 500 too (a server known to save no answer for it).
#[derive(Debug)]
struct AlsoServerErrors;

impl Classify for AlsoServerErrors {
    fn response(&self, status: http::StatusCode, headers: &http::HeaderMap) -> Verdict {
        if status == http::StatusCode::INTERNAL_SERVER_ERROR {
            return Verdict::retry(Duration::ZERO, "server_error");
        }
        DefaultClassifier.response(status, headers)
    }

    fn error(&self, error: &(dyn std::error::Error + 'static)) -> Verdict {
        DefaultClassifier.error(error)
    }
}

/// Retries what the default retries, but no error at all.
#[derive(Debug)]
struct NoErrorRetried;

impl Classify for NoErrorRetried {
    fn response(&self, status: http::StatusCode, headers: &http::HeaderMap) -> Verdict {
        DefaultClassifier.response(status, headers)
    }

    fn error(&self, _: &(dyn std::error::Error + 'static)) -> Verdict {
        Verdict::Final
    }
}

pub async fn a_custom_classifier_decides_which_errors_are_retried<C: TestClient>() {
    let addr = server::free_port().await;
    let (client, probe) = client::<C>(fast().with_classifier(NoErrorRetried));
    let err = client
        .post(&format!("http://{addr}/orders"), None)
        .await
        .unwrap_err();
    assert!(!err.is_empty());
    assert_eq!(
        probe.attempts(),
        1,
        "the classifier refused to retry the connect error"
    );
}

pub async fn a_custom_classifier_decides_what_is_retried<C: TestClient>() {
    let server = Scripted::start(
        &[Answer::Status(500), Answer::Status(500)],
        Answer::Status(201),
    )
    .await;
    let (retrying, probe) = client::<C>(fast().with_classifier(AlsoServerErrors));
    let answered = retrying.post(&server.url(), None).await.unwrap();
    assert_eq!((answered.status, answered.attempts.count), (201, 3));
    assert_eq!(probe.attempts(), 3);
    let keys = server.keys();
    assert!(keys.iter().all(|key| key == &keys[0]), "one key: {keys:?}");
    // What the default classifier retries, this one still does.
    let server = Scripted::start(&[Answer::Status(503)], Answer::Status(201)).await;
    let (other, _) = client::<C>(fast().with_classifier(AlsoServerErrors));
    let answered = other.post(&server.url(), None).await.unwrap();
    assert_eq!(answered.attempts.count, 2);
}

pub async fn another_header_name_carries_the_key<C: TestClient>() {
    let server = Scripted::start(&[Answer::Status(503)], Answer::Status(201)).await;
    let config = fast().with_header_name(http::HeaderName::from_static("x-idempotency-key"));
    let (renamed, _) = client::<C>(config);
    let answered = renamed.post(&server.url(), None).await.unwrap();
    assert_eq!((answered.status, answered.attempts.count), (201, 2));
    let seen = server.seen();
    assert!(
        seen.iter().all(|s| s.key.is_none()),
        "nothing under Idempotency-Key"
    );
    let first = seen[0]
        .other_key
        .clone()
        .expect("a key under x-idempotency-key");
    assert!(seen.iter().all(|s| s.other_key.as_ref() == Some(&first)));
    uuid::Uuid::parse_str(&first).expect("a generated UUID");
}

pub async fn a_key_source_gives_the_same_key_after_a_restart<C: TestClient>() {
    // The key comes from the intent (an outbox row), not from the process: a "restarted" client,
    // a new one with the same source, retries the same intent with the same key.
    let source =
        |_: &http::Method, _: &http::HeaderMap| Some(http::HeaderValue::from_static("outbox-7"));
    let server = Scripted::start(&[Answer::Status(503)], Answer::Status(201)).await;
    let (first, _) = client::<C>(fast().with_key_source(source));
    assert_eq!(
        first
            .post(&server.url(), None)
            .await
            .unwrap()
            .attempts
            .count,
        2
    );
    let (restarted, _) = client::<C>(fast().with_key_source(source));
    restarted.post(&server.url(), None).await.unwrap();
    assert_eq!(server.keys(), vec![Some("outbox-7".to_owned()); 3]);
}

/// One `#[tokio::test]` per case above, for the client adapter `$client`.
#[macro_export]
macro_rules! suite {
    ($client:ty: $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread")]
            async fn $case() {
                common::$case::<$client>().await;
            }
        )*
    };
}

/// Every case of the suite, for the client adapter `$client`.
#[macro_export]
macro_rules! all_cases {
    ($client:ty) => {
        $crate::suite!($client:
            every_attempt_carries_the_same_key,
            a_new_intent_gets_a_new_key,
            the_callers_key_is_reused,
            retry_after_is_honoured,
            a_conflict_without_retry_after_is_not_retried,
            client_errors_and_500_are_not_retried,
            unavailable_is_retried_up_to_max_attempts,
            a_timeout_is_retried_with_the_same_key,
            a_connect_error_is_retried,
            a_dead_server_costs_max_attempts,
            an_unkeyed_request_is_sent_once,
            the_deadline_ends_the_retries,
            the_budget_stops_a_retry_storm,
            a_custom_classifier_decides_what_is_retried,
            a_custom_classifier_decides_which_errors_are_retried,
            another_header_name_carries_the_key,
            a_key_source_gives_the_same_key_after_a_restart,
        );
    };
}
