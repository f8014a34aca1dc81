//! The same policy as a [`reqwest_middleware::Middleware`].

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::{
    config::{ConfigError, RetryConfig},
    key::ensure_key,
    policy::{is_transient, Outcome, Policy},
    Attempts, Error,
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

#[async_trait::async_trait]
impl Middleware for IdempotentRetryMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let method = request.method().clone();
        let key = ensure_key(&self.policy.config, &method, request.headers_mut());
        let replayable = request.try_clone().is_some();
        let mut intent = self.policy.start(key.is_some() && replayable);
        let mut request = Some(request);
        loop {
            let timeout = intent.begin_attempt();
            let this = match request.as_ref().and_then(Request::try_clone) {
                Some(copy) => copy,
                None => request
                    .take()
                    .expect("a body that cannot be cloned is sent once"),
            };
            let result = tokio::time::timeout(timeout, next.clone().run(this, extensions)).await;
            let outcome = match &result {
                Ok(Ok(response)) => Outcome::answer(response.status(), response.headers()),
                Ok(Err(reqwest_middleware::Error::Reqwest(err)))
                    if err.is_connect() || err.is_timeout() || is_transient(err) =>
                {
                    Outcome::TransientError
                }
                Ok(Err(_)) => Outcome::PermanentError,
                Err(_) => Outcome::TimedOut,
            };
            if let Some(wait) = intent.retry_after(outcome) {
                drop(result);
                tokio::time::sleep(wait).await;
                continue;
            }
            let attempts = intent.attempts();
            return match result {
                Ok(Ok(mut response)) => {
                    response.extensions_mut().insert(Attempts {
                        count: attempts,
                        key,
                    });
                    Ok(response)
                }
                Ok(Err(err)) => Err(err),
                Err(_) => Err(reqwest_middleware::Error::middleware(Error::Timeout {
                    attempts,
                    timeout,
                })),
            };
        }
    }
}
