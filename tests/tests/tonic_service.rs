//! The layer on a tonic gRPC service (written by hand: `tonic::server::Grpc` and prost derives,
//! no protoc). The key comes from the `idempotency-key` metadata; a replay carries the first
//! answer's `grpc-status` trailers; a "try again" gRPC status releases the key.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use bytes::{BufMut, Bytes, BytesMut};
use http::{uri::PathAndQuery, Request};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    service::TowerToHyperService,
};
use prost::Message;
use tokio::net::{TcpListener, TcpStream};
use tonic::{metadata::MetadataValue, transport::Channel, Code, Status};
use tonic_prost::ProstCodec;
use tower_idempotency::{store::MemoryStore, IdempotencyService, RequestBody};

const CREATE: &str = "/orders.Orders/Create";

/// The request message of `orders.Orders/Create`.
#[derive(Clone, PartialEq, Message)]
struct CreateOrder {
    #[prost(string, tag = "1")]
    customer: String,
    #[prost(int64, tag = "2")]
    total_cents: i64,
}

/// The reply: which run of the handler produced it.
#[derive(Clone, PartialEq, Message)]
struct OrderCreated {
    #[prost(uint64, tag = "1")]
    run: u64,
    #[prost(string, tag = "2")]
    customer: String,
}

/// A gRPC server on HTTP/2 (hyper) whose one unary method sits behind the layer. The customer
/// name picks the behaviour: `flaky` fails its first run with UNAVAILABLE, `invalid` always
/// fails with INVALID_ARGUMENT, anything else succeeds.
async fn serve() -> (SocketAddr, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let method = {
        let runs = runs.clone();
        tower::service_fn(move |req: tonic::Request<CreateOrder>| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let order = req.into_inner();
                match order.customer.as_str() {
                    "flaky" if run == 1 => Err(Status::unavailable("warming up, try again")),
                    "invalid" => Err(Status::invalid_argument("total_cents must be positive")),
                    _ => Ok(tonic::Response::new(OrderCreated {
                        run,
                        customer: order.customer,
                    })),
                }
            }
        })
    };
    let grpc = tower::service_fn(move |req: Request<RequestBody<Incoming>>| {
        let method = method.clone();
        async move {
            assert_eq!(req.uri().path(), CREATE);
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<OrderCreated, CreateOrder>::default());
            Ok::<_, Infallible>(grpc.unary(method, req).await)
        }
    });
    let service = IdempotencyService::new(grpc, MemoryStore::new());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, runs)
}

async fn client(addr: SocketAddr) -> tonic::client::Grpc<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the test gRPC server");
    tonic::client::Grpc::new(channel)
}

/// Call `Create` with `key` in the `idempotency-key` metadata.
async fn create(
    client: &mut tonic::client::Grpc<Channel>,
    key: &'static str,
    customer: &str,
) -> Result<tonic::Response<OrderCreated>, Status> {
    let mut request = tonic::Request::new(CreateOrder {
        customer: customer.to_owned(),
        total_cents: 4000,
    });
    request
        .metadata_mut()
        .insert("idempotency-key", MetadataValue::from_static(key));
    client.ready().await.unwrap();
    client
        .unary(
            request,
            PathAndQuery::from_static(CREATE),
            ProstCodec::<CreateOrder, OrderCreated>::default(),
        )
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_unary_call_is_replayed_with_its_grpc_status_trailers() {
    let (addr, runs) = serve().await;
    let mut client = client(addr).await;

    let first = create(&mut client, "grpc-1", "c_1").await.unwrap();
    assert!(first.metadata().get("idempotent-replayed").is_none());
    assert_eq!(first.get_ref().run, 1);

    let retry = create(&mut client, "grpc-1", "c_1").await.unwrap();
    assert_eq!(retry.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(retry.get_ref(), first.get_ref());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The same call on a raw HTTP/2 connection, to see the frames: the replayed body is followed
    // by the saved trailers, `grpc-status: 0` among them.
    let message = CreateOrder {
        customer: "c_1".to_owned(),
        total_cents: 4000,
    }
    .encode_to_vec();
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0); // not compressed
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::post(format!("http://{addr}{CREATE}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header("idempotency-key", "grpc-1")
        .body(Full::new(framed.freeze()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the replay sends trailers");
    assert_eq!(trailers["grpc-status"], "0");
    let body: Bytes = collected.to_bytes();
    let reply = OrderCreated::decode(&body[5..]).unwrap();
    assert_eq!(reply.run, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn unavailable_releases_the_key_so_the_retry_runs_again() {
    let (addr, runs) = serve().await;
    let mut client = client(addr).await;

    let first = create(&mut client, "grpc-2", "flaky").await.unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);

    let retry = create(&mut client, "grpc-2", "flaky").await.unwrap();
    assert_eq!(retry.get_ref().run, 2, "the retry ran the method again");
    assert!(retry.metadata().get("idempotent-replayed").is_none());

    let again = create(&mut client, "grpc-2", "flaky").await.unwrap();
    assert_eq!(again.get_ref().run, 2);
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_final_grpc_error_is_saved_and_replayed() {
    let (addr, runs) = serve().await;
    let mut client = client(addr).await;

    let first = create(&mut client, "grpc-3", "invalid").await.unwrap_err();
    assert_eq!(first.code(), Code::InvalidArgument);
    let retry = create(&mut client, "grpc-3", "invalid").await.unwrap_err();
    assert_eq!(retry.code(), Code::InvalidArgument);
    assert_eq!(retry.message(), first.message());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the error was replayed, not rerun"
    );
}
