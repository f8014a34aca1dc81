//! The same policy as a [`reqwest_middleware::Middleware`].

use std::future::Future;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::{
    config::{ConfigError, RetryConfig},
    policy::{drive, Attempt, Ended, Policy},
    Attempts, Error, Verdict,
};

/// A reqwest-middleware [`Middleware`] with the policy of [`IdempotentRetryLayer`]: one key per
/// intent (one `execute`), the same retries, backoff, deadline and budget.
///
/// A request whose body cannot be cloned (a stream) is sent once. Errors from reqwest come back
/// as [`reqwest_middleware::Error::Reqwest`], unchanged; a timeout as
/// [`reqwest_middleware::Error::Middleware`] holding this crate's [`Error::Timeout`].
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use tower_idempotency_client::IdempotentRetryMiddleware;
///
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotentRetryMiddleware::default())
///     .build();
/// ```
///
/// [`IdempotentRetryLayer`]: crate::IdempotentRetryLayer
#[derive(Debug, Clone)]
pub struct IdempotentRetryMiddleware {
    policy: Policy,
}

impl IdempotentRetryMiddleware {
    /// A middleware with `config`, or the reason it cannot be used.
    pub fn new(config: RetryConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            policy: Policy::new(config)?,
        })
    }
}

impl Default for IdempotentRetryMiddleware {
    /// A middleware with [`RetryConfig::default`].
    fn default() -> Self {
        Self::new(RetryConfig::default()).expect("the default config is valid")
    }
}

/// One attempt through the rest of the middleware chain. A body that cannot be cloned is sent
/// once: the intent was started unkeyed, so it is never retried.
struct ReqwestAttempt<'a, 'n> {
    request: Option<Request>,
    extensions: &'a mut Extensions,
    next: Next<'n>,
    policy: &'a Policy,
}

impl Attempt for ReqwestAttempt<'_, '_> {
    type Response = Response;
    type Error = reqwest_middleware::Error;

    fn send(&mut self) -> impl Future<Output = reqwest_middleware::Result<Response>> + Send + '_ {
        let this = match self.request.as_ref().and_then(Request::try_clone) {
            Some(copy) => copy,
            None => self
                .request
                .take()
                .expect("a body that cannot be cloned is sent once"),
        };
        self.next.clone().run(this, self.extensions)
    }

    fn classify(&self, result: &reqwest_middleware::Result<Response>) -> Verdict {
        let classifier = &self.policy.config.classifier;
        match result {
            Ok(response) => classifier.response(response.status(), response.headers()),
            // The classifier decides every error, as under the tower front end; reqwest's own
            // timeouts (its client's `timeout`) are its `timed_out`.
            Err(reqwest_middleware::Error::Reqwest(err)) if err.is_timeout() => {
                classifier.timed_out()
            }
            Err(reqwest_middleware::Error::Reqwest(err)) => classifier.error(err),
            Err(reqwest_middleware::Error::Middleware(err)) => classifier.error(err.as_ref()),
        }
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotentRetryMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let method = request.method().clone();
        let key = self.policy.ensure_key(&method, request.headers_mut());
        let replayable = request.try_clone().is_some();
        let intent = self.policy.start(key.is_some() && replayable);
        let attempt = ReqwestAttempt {
            request: Some(request),
            extensions,
            next,
            policy: &self.policy,
        };
        match drive(intent, attempt).await {
            (Ended::Result(Ok(mut response)), count) => {
                response.extensions_mut().insert(Attempts::new(count, key));
                Ok(response)
            }
            (Ended::Result(Err(err)), _) => Err(err),
            (Ended::TimedOut { timeout }, attempts) => {
                Err(reqwest_middleware::Error::middleware(Error::Timeout {
                    attempts,
                    timeout,
                }))
            }
        }
    }
}
