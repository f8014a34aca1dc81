//! `rabbitmq::process_delivery` against the RabbitMQ at `AMQP_URL`: what is acked, requeued and
//! rejected, on a queue of its own. (The kill-and-restart proof is `examples/brokers`.)

mod common;

use std::{num::NonZeroU32, time::Duration};

use futures_util::StreamExt;
use tower_idempotency_consumer::{
    rabbitmq::{
        self,
        lapin::{
            options::{
                BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
                QueueDeclareOptions, QueueDeleteOptions,
            },
            types::{AMQPValue, FieldTable},
            BasicProperties, Connection, ConnectionProperties,
        },
    },
    PgConsumer,
};
use tower_idempotency_testkit::rabbitmq_ready;

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_are_acked_after_the_commit_requeued_on_failure_parked_and_rejected_without_id()
{
    let url = std::env::var("AMQP_URL")
        .expect("AMQP_URL is not set: export AMQP_URL=amqp://127.0.0.1:5672/%2f");
    let (pool, _) = common::fresh_postgres().await;
    let ledger =
        PgConsumer::new(pool.clone(), "ledger").with_max_attempts(NonZeroU32::new(3).expect("3"));
    let queue = common::unique_name("tidem_consumer_rabbitmq");

    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("cannot reach RabbitMQ at AMQP_URL={url}: {e}"));
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare the queue");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    for (id, body) in common::MESSAGES {
        let mut properties = BasicProperties::default();
        if let Some(id) = id {
            properties = properties.with_message_id(id.into());
        }
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                properties,
            )
            .await
            .expect("publish")
            .await
            .expect("confirmed");
    }
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");

    // ok once; poison three times (twice requeued, then parked and acked); no id once.
    let mut seen = Vec::new();
    let mut received = Vec::new();
    for _ in 0..5 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("a delivery within 10 s")
            .expect("the consumer is open")
            .expect("a delivery");
        let received_at = tokio::time::Instant::now();
        let body = String::from_utf8(delivery.data.clone()).expect("utf-8");
        let handled =
            rabbitmq::process_delivery(&ledger, &delivery, common::record_unless_poison(body))
                .await
                .expect("settled with the broker");
        received.push((handled.event_id.clone(), received_at));
        seen.push(handled);
    }
    common::assert_requeues_wait(&received);

    let poison = common::assert_each_settlement(&seen);
    assert!(
        !poison[0].redelivered,
        "the first delivery is not a redelivery"
    );
    assert!(
        poison[1].redelivered,
        "a requeued message comes back flagged redelivered"
    );
    assert_eq!(poison[0].deliveries, Some(1), "a first delivery");
    assert_eq!(
        poison[1].deliveries, None,
        "a classic queue does not count redeliveries"
    );

    // Nothing left: every delivery was settled.
    assert_eq!(rabbitmq_ready(&channel, &queue).await, 0);
    let parked = ledger.parked(10).await.expect("parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].event_id, "evt_poison");
    assert_eq!(parked[0].payload.as_deref(), Some(&b"poison"[..]));
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .expect("effects");
    assert_eq!(effects, 1);

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the queue");
    connection.close(200, "done".into()).await.expect("close");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_work_that_panics_gives_its_delivery_back_at_once_and_the_redelivery_runs_it() {
    let url = std::env::var("AMQP_URL")
        .expect("AMQP_URL is not set: export AMQP_URL=amqp://127.0.0.1:5672/%2f");
    let (pool, _) = common::fresh_postgres().await;
    let ledger = PgConsumer::new(pool.clone(), "ledger");
    let queue = common::unique_name("tidem_consumer_rabbitmq_panic");
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("cannot reach RabbitMQ at AMQP_URL={url}: {e}"));
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare the queue");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"ok",
            BasicProperties::default().with_message_id("evt_ok".into()),
        )
        .await
        .expect("publish")
        .await
        .expect("confirmed");
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("a delivery within 10 s, while the channel stays open")
            .expect("the consumer is open")
            .expect("a delivery")
    };

    let first = next().await;
    let panicked = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            rabbitmq::process_delivery(&ledger, &first, |tx: &mut sqlx::PgConnection| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO effects (event_id, delivery) VALUES ('evt_ok', 1)")
                        .execute(&mut *tx)
                        .await?;
                    panic!("the work panicked after its write");
                    #[allow(unreachable_code)]
                    Ok::<(), sqlx::Error>(())
                })
            })
            .await
        }
    })
    .await;
    assert!(panicked.expect_err("the task panicked").is_panic());

    let again = next().await;
    assert!(
        again.redelivered,
        "the panicked delivery comes back flagged"
    );
    let handled =
        rabbitmq::process_delivery(&ledger, &again, common::record_unless_poison("ok".into()))
            .await
            .expect("settled with the broker");
    assert!(
        matches!(
            handled.result,
            Ok(tower_idempotency_consumer::Outcome::Processed(()))
        ),
        "{handled:?}"
    );
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&pool)
        .await
        .expect("effects");
    assert_eq!(effects, 1, "the panicked attempt's write rolled back");
    assert_eq!(rabbitmq_ready(&channel, &queue).await, 0);

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the queue");
    connection.close(200, "done".into()).await.expect("close");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quorum_queue_counts_each_delivery() {
    let url = std::env::var("AMQP_URL")
        .expect("AMQP_URL is not set: export AMQP_URL=amqp://127.0.0.1:5672/%2f");
    let (pool, _) = common::fresh_postgres().await;
    let ledger =
        PgConsumer::new(pool.clone(), "ledger").with_max_attempts(NonZeroU32::new(3).expect("3"));
    let queue = common::unique_name("tidem_consumer_rabbitmq_quorum");
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("cannot reach RabbitMQ at AMQP_URL={url}: {e}"));
    let channel = connection.create_channel().await.expect("a channel");
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            quorum,
        )
        .await
        .expect("declare a quorum queue");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"poison",
            BasicProperties::default().with_message_id("evt_poison".into()),
        )
        .await
        .expect("publish")
        .await
        .expect("confirmed");
    channel
        .basic_qos(1, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let mut counted = Vec::new();
    for _ in 0..3 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("a delivery within 10 s")
            .expect("the consumer is open")
            .expect("a delivery");
        let handled = rabbitmq::process_delivery(
            &ledger,
            &delivery,
            common::record_unless_poison("poison".into()),
        )
        .await
        .expect("settled with the broker");
        counted.push(handled.deliveries);
    }
    assert_eq!(counted, [Some(1), Some(2), Some(3)]);
    assert_eq!(rabbitmq_ready(&channel, &queue).await, 0);

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the queue");
    connection.close(200, "done".into()).await.expect("close");
}
