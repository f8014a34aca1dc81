//! `nats::process_message` against the NATS JetStream at `NATS_URL`: what is acked, nak'ed and
//! terminated, on a stream of its own. (The kill-and-restart proof is `examples/brokers`.)

mod common;

use std::{num::NonZeroU32, time::Duration};

use futures_util::StreamExt;
use tower_idempotency_consumer::{
    nats::{
        self,
        async_nats::{self, header::NATS_MESSAGE_ID, jetstream, HeaderMap},
    },
    PgConsumer,
};

#[tokio::test(flavor = "multi_thread")]
async fn messages_are_acked_after_the_commit_naked_on_failure_parked_and_terminated_without_id() {
    let url =
        std::env::var("NATS_URL").expect("NATS_URL is not set: export NATS_URL=127.0.0.1:4222");
    let (pool, _) = common::fresh_postgres().await;
    let ledger =
        PgConsumer::new(pool.clone(), "ledger").with_max_attempts(NonZeroU32::new(3).expect("3"));
    let name = common::unique_name("TIDEM_CONSUMER");
    let subject = format!("tidem.{name}");

    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach NATS at NATS_URL={url}: {e}"));
    let js = jetstream::new(client);
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("create the stream (JetStream enabled?)");
    for (id, body) in common::MESSAGES {
        let mut headers = HeaderMap::new();
        if let Some(id) = id {
            headers.insert(NATS_MESSAGE_ID, id);
        }
        js.publish_with_headers(subject.clone(), headers, body.into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("ledger".into()),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 1,
            ..Default::default()
        })
        .await
        .expect("a durable consumer");
    let mut messages = consumer.messages().await.expect("messages");

    // ok once; poison three times (twice nak'ed, then parked and acked); no id once.
    let mut seen = Vec::new();
    let mut received = Vec::new();
    for _ in 0..5 {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("a message within 10 s")
            .expect("the stream is open")
            .expect("a message");
        let received_at = tokio::time::Instant::now();
        let body = String::from_utf8(message.payload.to_vec()).expect("utf-8");
        let handled = nats::process_message(&ledger, &message, common::record_unless_poison(body))
            .await
            .expect("settled with the server");
        received.push((handled.event_id.clone(), received_at));
        seen.push(handled);
    }
    common::assert_requeues_wait(&received);

    let poison = common::assert_each_settlement(&seen);
    assert_eq!(
        poison.iter().map(|p| p.deliveries).collect::<Vec<_>>(),
        [Some(1), Some(2), Some(3)],
        "JetStream's delivery count"
    );

    let info = stream.consumer_info("ledger").await.expect("consumer info");
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "every message settled"
    );
    let parked = ledger.parked(10).await.expect("parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].payload.as_deref(), Some(&b"poison"[..]));
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .expect("effects");
    assert_eq!(effects, 1);

    js.delete_stream(&name).await.expect("delete the stream");
}
