//! The NATS JetStream proof: 5,000 events, 10% published twice (half of the copies with the
//! original's `Nats-Msg-Id`, which the stream drops, half with another one, which it stores),
//! the consumer SIGKILLed mid-stream four times and restarted, redelivery after the ack wait;
//! at the end every event has exactly one effect.
//!
//! Needs NATS with JetStream at `NATS_URL` (e.g. `127.0.0.1:4222`) and PostgreSQL at
//! `DATABASE_URL`; a stream and a database of its own per run.

mod common;

use std::time::Instant;

use common::{
    assert_applied_once, distinct_effects, fresh_database, kill_then_finish, publications,
    required_env, unique_name, Tally, DEADLINE, DUPLICATES, EVENTS,
};
use tower_idempotency_consumer::nats::async_nats::{
    self,
    header::NATS_MESSAGE_ID,
    jetstream::{self, stream},
    HeaderMap,
};

const BINARY: &str = env!("CARGO_BIN_EXE_nats-consumer");
const CONSUMER: &str = "ledger";
/// Short, so that a killed consumer's messages come back quickly.
const ACK_WAIT_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_consumers_apply_every_event_once() {
    let started = Instant::now();
    let deadline = started + DEADLINE;
    let nats_url = required_env("NATS_URL", "127.0.0.1:4222");
    let (pool, database_url) = fresh_database().await;
    let name = unique_name("TIDEM").replace('-', "_");
    let subject = format!("tidem.{name}.events");

    let client = async_nats::connect(&nats_url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach NATS at NATS_URL={nats_url}: {e}"));
    let js = jetstream::new(client);
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            // The default two minutes: every same-id republish below falls inside it.
            duplicate_window: std::time::Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create the stream (is JetStream enabled? nats-server -js)");

    let publications = publications(&name);
    let mut dropped_by_the_stream = 0;
    let mut copies_seen = 0;
    // Acks awaited in batches: the client bounds the publishes in flight.
    for batch in publications.chunks(500) {
        let mut acks = Vec::with_capacity(batch.len());
        for publication in batch {
            let msg_id = if publication.duplicate {
                copies_seen += 1;
                if copies_seen % 2 == 0 {
                    // A retry within the window: the stream drops it.
                    publication.id.clone()
                } else {
                    // A republish the window does not cover (later, or by another producer).
                    format!("{}:republished", publication.id)
                }
            } else {
                publication.id.clone()
            };
            let mut headers = HeaderMap::new();
            headers.insert(NATS_MESSAGE_ID, msg_id.as_str());
            acks.push(
                js.publish_with_headers(subject.clone(), headers, publication.body.clone().into())
                    .await
                    .expect("publish"),
            );
        }
        for ack in acks {
            if ack.await.expect("publish ack").duplicate {
                dropped_by_the_stream += 1;
            }
        }
    }
    assert_eq!(
        dropped_by_the_stream,
        DUPLICATES / 2,
        "JetStream dropped the same-id republishes"
    );

    let envs = [
        ("DATABASE_URL", database_url),
        ("NATS_URL", nats_url.clone()),
        ("STREAM", name.clone()),
        ("CONSUMER", CONSUMER.to_owned()),
        ("ACK_WAIT_MS", ACK_WAIT_MS.to_string()),
        ("MAX_ACK_PENDING", "64".to_owned()),
    ];
    let mut tally = Tally::default();
    kill_then_finish(BINARY, &envs, &mut tally, deadline, || async {
        if distinct_effects(&pool).await != EVENTS as i64 {
            return false;
        }
        let info = stream.consumer_info(CONSUMER).await.expect("consumer info");
        info.num_pending == 0 && info.num_ack_pending == 0
    })
    .await;

    assert_applied_once(&pool, &publications).await;
    let info = stream.consumer_info(CONSUMER).await.expect("consumer info");
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "every message was acknowledged"
    );
    common::assert_settled_and_report(
        "NATS JetStream",
        &tally,
        publications.len() - dropped_by_the_stream,
        started,
    );
    println!("NATS JetStream: {dropped_by_the_stream} same-id republishes dropped by the stream's duplicate window");

    js.delete_stream(&name).await.expect("delete the stream");
}
