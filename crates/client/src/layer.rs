//! The layer: one [`Policy`] (config and budget) for every service it wraps.

use tower_layer::Layer;

use crate::{
    config::{ConfigError, RetryConfig},
    policy::Policy,
    service::IdempotentRetry,
};

/// Wraps a client service in [`IdempotentRetry`]: one `Idempotency-Key` per intent, and retries
/// that are safe for a keyed request.
///
/// Every service this layer makes, and every clone of it, shares one retry budget.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::{client::legacy::Client, rt::TokioExecutor};
/// use tower::ServiceBuilder;
/// use tower_idempotency_client::IdempotentRetryLayer;
///
/// let hyper_client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
/// let client = ServiceBuilder::new()
///     .layer(IdempotentRetryLayer::default())
///     .service(hyper_client);
/// ```
#[derive(Debug, Clone)]
pub struct IdempotentRetryLayer {
    policy: Policy,
}

impl IdempotentRetryLayer {
    /// A layer with `config`, or the reason it cannot be used.
    pub fn new(config: RetryConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            policy: Policy::new(config)?,
        })
    }
}

impl Default for IdempotentRetryLayer {
    /// A layer with [`RetryConfig::default`].
    fn default() -> Self {
        Self::new(RetryConfig::default()).expect("the default config is valid")
    }
}

impl<S> Layer<S> for IdempotentRetryLayer {
    type Service = IdempotentRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentRetry::from_policy(inner, self.policy.clone())
    }
}
