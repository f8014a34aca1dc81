//! The service: sends each attempt of an intent with the same key, and decides after each one.

use std::{
    future::{poll_fn, Future},
    mem,
    task::{Context, Poll},
};

use http::{HeaderValue, Request, Response};
use tower_service::Service;

use crate::{
    config::{ConfigError, RetryConfig},
    error::BoxError,
    future::ResponseFuture,
    policy::{drive, Attempt, Ended, Intent, Policy},
    Error, Verdict,
};

/// What an intent took, in the extensions of its response.
///
/// ```
/// # async fn run(response: http::Response<()>) {
/// use tower_idempotency_client::Attempts;
///
/// if let Some(attempts) = response.extensions().get::<Attempts>() {
///     println!("{} attempt(s) with key {:?}", attempts.count, attempts.key);
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempts {
    /// Attempts sent, the first included.
    pub count: u32,
    /// The key every attempt carried, if the request had one.
    pub key: Option<HeaderValue>,
}

impl Attempts {
    pub(crate) fn new(count: u32, key: Option<HeaderValue>) -> Self {
        Self { count, key }
    }
}

/// A client service that gives each request (one intent) a single `Idempotency-Key` and retries
/// it with that key when it is safe: transport errors, timeouts, 409 with `Retry-After` (another
/// attempt with this key is in flight), 429 and 503. Built by [`IdempotentRetryLayer`].
///
/// The request body must be [`Clone`] (like `Full<Bytes>`), since every attempt sends it again.
///
/// [`IdempotentRetryLayer`]: crate::IdempotentRetryLayer
#[derive(Debug, Clone)]
pub struct IdempotentRetry<S> {
    inner: S,
    policy: Policy,
}

impl<S> IdempotentRetry<S> {
    /// Wrap `inner` with `config` (its own retry budget).
    pub fn new(inner: S, config: RetryConfig) -> Result<Self, ConfigError> {
        Ok(Self::from_policy(inner, Policy::new(config)?))
    }

    pub(crate) fn from_policy(inner: S, policy: Policy) -> Self {
        Self { inner, policy }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, ResBody> Service<Request<B>> for IdempotentRetry<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Clone + Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = Error;
    type Future = ResponseFuture<ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(|err| Error::Transport {
            attempts: 0,
            source: err.into(),
        })
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let method = request.method().clone();
        let key = self.policy.ensure_key(&method, request.headers_mut());
        let intent = self.policy.start(key.is_some());
        // The clone may not be ready; the ready one goes into the future (tower's "be careful
        // when cloning inner services").
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        ResponseFuture::new(Box::pin(run(
            inner,
            request,
            key,
            intent,
            self.policy.clone(),
        )))
    }
}

/// One attempt through the inner service: the first uses the service `poll_ready` readied.
struct TowerAttempt<S, B> {
    inner: S,
    request: Request<B>,
    ready: bool,
    policy: Policy,
}

impl<S, B, ResBody> Attempt for TowerAttempt<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Send,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Clone + Send,
{
    type Response = Response<ResBody>;
    type Error = BoxError;

    fn send(&mut self) -> impl Future<Output = Result<Self::Response, BoxError>> + Send + '_ {
        // The copy is made here, not in the future, so the future holds no `&Request` (the body
        // need not be `Sync`).
        let copy = self.request.clone();
        let ready = std::mem::replace(&mut self.ready, false);
        let service = &mut self.inner;
        async move {
            if !ready {
                poll_fn(|cx| service.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
            }
            service.call(copy).await.map_err(Into::into)
        }
    }

    fn classify(&self, result: &Result<Self::Response, BoxError>) -> Verdict {
        let classifier = &self.policy.config.classifier;
        match result {
            Ok(response) => classifier.response(response.status(), response.headers()),
            Err(err) => classifier.error(err.as_ref()),
        }
    }
}

/// Run the intent through the retry core, and put what it took on the answer.
async fn run<S, B, ResBody>(
    inner: S,
    request: Request<B>,
    key: Option<HeaderValue>,
    intent: Intent,
    policy: Policy,
) -> Result<Response<ResBody>, Error>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Send,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Clone + Send,
    ResBody: Send,
{
    let attempt = TowerAttempt {
        inner,
        request,
        ready: true,
        policy,
    };
    match drive(intent, attempt).await {
        (Ended::Result(Ok(mut response)), count) => {
            response.extensions_mut().insert(Attempts::new(count, key));
            Ok(response)
        }
        (Ended::Result(Err(source)), attempts) => Err(Error::Transport { attempts, source }),
        (Ended::TimedOut { timeout }, attempts) => Err(Error::Timeout { attempts, timeout }),
    }
}
