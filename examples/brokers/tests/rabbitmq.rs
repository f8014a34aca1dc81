//! The RabbitMQ proof: 5,000 events, 10% published twice, the consumer SIGKILLed mid-stream
//! four times and restarted; at the end every event has exactly one effect.
//!
//! Needs RabbitMQ at `AMQP_URL` (e.g. `amqp://127.0.0.1:5672/%2f`) and PostgreSQL at
//! `DATABASE_URL`; a queue and a database of its own per run.

mod common;

use std::time::Instant;

use broker_consumers_example::{proof::rabbitmq_ready, rabbitmq::open_queue};
use common::{
    assert_applied_once, distinct_effects, fresh_database, kill_then_finish, publications,
    required_env, unique_name, Tally, DEADLINE, EVENTS,
};
use tower_idempotency_consumer::rabbitmq::lapin::{
    options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions},
    BasicProperties,
};

const BINARY: &str = env!("CARGO_BIN_EXE_rabbitmq-consumer");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_consumers_apply_every_event_once() {
    let started = Instant::now();
    let deadline = started + DEADLINE;
    let amqp_url = required_env("AMQP_URL", "amqp://127.0.0.1:5672/%2f");
    let (pool, database_url) = fresh_database().await;
    let queue = unique_name("tidem_rabbitmq");

    // The same declaration as the consumer's.
    let (connection, channel) = open_queue(&amqp_url, &queue)
        .await
        .unwrap_or_else(|e| panic!("open the queue: {e}"));
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("publisher confirms");
    let publications = publications(&queue);
    let mut confirms = Vec::with_capacity(publications.len());
    for publication in &publications {
        let properties = BasicProperties::default()
            .with_message_id(publication.id.as_str().into())
            .with_delivery_mode(2);
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &publication.body,
                    properties,
                )
                .await
                .expect("publish"),
        );
    }
    for confirm in confirms {
        let confirmation = confirm.await.expect("publisher confirm");
        assert!(confirmation.is_ack(), "the broker took every message");
    }

    let envs = [
        ("DATABASE_URL", database_url),
        ("AMQP_URL", amqp_url.clone()),
        ("QUEUE", queue.clone()),
        ("PREFETCH", "32".to_owned()),
    ];
    let mut tally = Tally::default();
    kill_then_finish(BINARY, &envs, &mut tally, deadline, || async {
        distinct_effects(&pool).await == EVENTS as i64
            && rabbitmq_ready(&channel, &queue).await == 0
    })
    .await;

    assert_applied_once(&pool, &publications).await;
    assert_eq!(
        rabbitmq_ready(&channel, &queue).await,
        0,
        "every message was acknowledged"
    );
    common::assert_settled_and_report("RabbitMQ", &tally, publications.len(), started);

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the queue");
    connection.close(200, "done".into()).await.expect("close");
}
