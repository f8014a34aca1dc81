//! The retry suite through the tower layer over hyper-util's client.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{Answered, Probe, TestClient};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{util::BoxCloneSyncService, Layer, ServiceExt};
use tower_idempotency_client::{Attempts, Error, IdempotentRetryLayer, RetryConfig};

type Service = BoxCloneSyncService<Request<Full<Bytes>>, Response<Incoming>, Error>;

struct TowerClient(Service);

impl TestClient for TowerClient {
    fn new(config: RetryConfig, probe: Arc<Probe>) -> Self {
        let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let probed = tower::service_fn(move |request: Request<Full<Bytes>>| {
            let hyper = hyper.clone();
            let probe = probe.clone();
            async move {
                probe.count();
                let result = hyper.request(request).await;
                if result.is_err() {
                    probe.failed().await;
                }
                result
            }
        });
        let layer = IdempotentRetryLayer::new(config).unwrap();
        Self(BoxCloneSyncService::new(layer.layer(probed)))
    }

    async fn post(&self, url: &str, key: Option<&str>) -> Result<Answered, String> {
        let mut request = Request::post(url).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
        match self.0.clone().oneshot(request).await {
            Ok(response) => Ok(Answered {
                status: response.status().as_u16(),
                attempts: response.extensions().get::<Attempts>().unwrap().clone(),
            }),
            Err(err) => Err(format!("{err}")),
        }
    }
}

all_cases!(TowerClient);

#[tokio::test]
async fn errors_say_how_many_attempts_were_made() {
    let addr = common::server::free_port().await;
    let hyper = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let layer = IdempotentRetryLayer::new(common::fast().with_max_attempts(2)).unwrap();
    let request = Request::post(format!("http://{addr}/orders"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let err = layer.layer(hyper).oneshot(request).await.unwrap_err();
    assert_eq!(err.attempts(), 2);
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
}
