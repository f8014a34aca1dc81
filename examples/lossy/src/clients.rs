//! The two clients compared: a naive one that retries with a new key per attempt, and the
//! idempotent one from `tower-idempotency-client` that keeps one key per intent.

use std::{future::Future, time::Duration};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use tower::ServiceExt;
use tower_idempotency_client::{Attempts, IdempotentRetry, RetryConfig};

/// Attempts per intent for both clients, so neither gives up sooner than the other.
pub const MAX_ATTEMPTS: u32 = 10;
/// The pause between two attempts of the naive client, and the idempotent client's base backoff.
pub const RETRY_DELAY: Duration = Duration::from_millis(5);

type HyperClient = Client<HttpConnector, Full<Bytes>>;

/// What placing one order took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Requests sent.
    pub attempts: u32,
    /// Whether the client finally got the 201.
    pub created: bool,
}

/// A client that places orders through `POST /orders`.
pub trait PlaceOrder: Send + Sync {
    /// Place one order (one intent): `{"customerId": customer_id, "totalCents": total_cents}`.
    fn place(&self, customer_id: &str, total_cents: i64) -> impl Future<Output = Placed> + Send;
}

fn order_request(url: &Uri, customer_id: &str, total_cents: i64) -> Request<Full<Bytes>> {
    let body = format!(r#"{{"customerId":"{customer_id}","totalCents":{total_cents}}}"#);
    Request::post(url.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid request")
}

/// Read the body to the end, so the connection goes back to the pool.
async fn finish(response: Response<Incoming>) -> StatusCode {
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

/// Retries every failure, as a client without keys must to be reliable, but sends each attempt
/// with a fresh key: to the server every attempt is a new order.
#[derive(Debug, Clone)]
pub struct NaiveClient {
    client: HyperClient,
    url: Uri,
}

impl NaiveClient {
    /// A client for `POST {base}/orders`.
    pub fn new(base: &str) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            url: format!("{base}/orders").parse().expect("a valid URL"),
        }
    }
}

impl PlaceOrder for NaiveClient {
    async fn place(&self, customer_id: &str, total_cents: i64) -> Placed {
        for attempt in 1..=MAX_ATTEMPTS {
            let mut request = order_request(&self.url, customer_id, total_cents);
            let key = uuid::Uuid::new_v4().to_string();
            request.headers_mut().insert(
                "idempotency-key",
                key.parse().expect("a UUID is a header value"),
            );
            if let Ok(response) = self.client.request(request).await {
                let status = finish(response).await;
                if status.is_success() {
                    return Placed {
                        attempts: attempt,
                        created: true,
                    };
                }
                if status.is_client_error() && status != StatusCode::CONFLICT {
                    return Placed {
                        attempts: attempt,
                        created: false,
                    };
                }
            }
            tokio::time::sleep(RETRY_DELAY).await;
        }
        Placed {
            attempts: MAX_ATTEMPTS,
            created: false,
        }
    }
}

/// The client of `tower-idempotency-client`: one key per intent, reused by every attempt.
#[derive(Debug, Clone)]
pub struct IdempotentClient {
    service: IdempotentRetry<HyperClient>,
    url: Uri,
}

impl IdempotentClient {
    /// A client for `POST {base}/orders`.
    pub fn new(base: &str) -> Self {
        let config = RetryConfig::default()
            .with_max_attempts(MAX_ATTEMPTS)
            .with_backoff(RETRY_DELAY, Duration::from_millis(200));
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self {
            service: IdempotentRetry::new(client, config).expect("a valid retry config"),
            url: format!("{base}/orders").parse().expect("a valid URL"),
        }
    }
}

impl PlaceOrder for IdempotentClient {
    async fn place(&self, customer_id: &str, total_cents: i64) -> Placed {
        let request = order_request(&self.url, customer_id, total_cents);
        match self.service.clone().oneshot(request).await {
            Ok(response) => {
                let attempts = response
                    .extensions()
                    .get::<Attempts>()
                    .map_or(1, |a| a.count);
                let status = finish(response).await;
                Placed {
                    attempts,
                    created: status.is_success(),
                }
            }
            Err(err) => Placed {
                attempts: err.attempts(),
                created: false,
            },
        }
    }
}
