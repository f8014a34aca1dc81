//! The retry suite through the reqwest-middleware adapter.

mod common;

use std::sync::Arc;

use common::{Answered, Probe, TestClient};
use http::Extensions;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use tower_idempotency_client::{Attempts, IdempotentRetryMiddleware, RetryConfig};

struct ProbeMiddleware(Arc<Probe>);

#[async_trait::async_trait]
impl Middleware for ProbeMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.count();
        let result = next.run(request, extensions).await;
        if result.is_err() {
            self.0.failed().await;
        }
        result
    }
}

struct ReqwestClient(ClientWithMiddleware);

impl TestClient for ReqwestClient {
    fn new(config: RetryConfig, probe: Arc<Probe>) -> Self {
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(IdempotentRetryMiddleware::new(config).unwrap())
            .with(ProbeMiddleware(probe))
            .build();
        Self(client)
    }

    async fn post(&self, url: &str, key: Option<&str>) -> Result<Answered, String> {
        let mut request = self
            .0
            .post(url)
            .header("content-type", "application/json")
            .body("{}");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        match request.send().await {
            Ok(response) => Ok(Answered {
                status: response.status().as_u16(),
                attempts: response.extensions().get::<Attempts>().unwrap().clone(),
            }),
            Err(err) => Err(format!("{err}")),
        }
    }
}

all_cases!(ReqwestClient);
