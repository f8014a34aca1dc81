//! `rabbitmq::process_delivery` against the RabbitMQ at `AMQP_URL`: what is acked, requeued and
//! rejected, on a queue of its own. (The kill-and-restart proof is `examples/brokers`.)

mod common;

use std::{num::NonZeroU32, time::Duration};

use futures_util::StreamExt;
use tower_idempotency_consumer::{
    rabbitmq::{
        self,
        lapin::{
            message::Delivery,
            options::{
                BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
                QueueDeclareOptions, QueueDeleteOptions,
            },
            types::{AMQPValue, FieldTable},
            BasicProperties, Channel, Connection, ConnectionProperties, Consumer,
        },
    },
    Outcome, PgConsumer,
};
use tower_idempotency_testkit::rabbitmq_ready;

/// A queue of its own on `AMQP_URL`, its messages published (and confirmed), and a consumer on
/// it that takes one delivery at a time.
struct Queue {
    connection: Connection,
    channel: Channel,
    name: String,
    deliveries: Consumer,
}

/// Which kind of queue [`Queue::with`] declares.
enum Kind {
    Classic,
    Quorum,
}

impl Queue {
    /// Declare the queue, publish `messages` (event id, if any, and body) and start consuming.
    async fn with(kind: Kind, messages: &[(Option<&str>, &str)]) -> Self {
        let url = std::env::var("AMQP_URL")
            .expect("AMQP_URL is not set: export AMQP_URL=amqp://127.0.0.1:5672/%2f");
        let connection = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("cannot reach RabbitMQ at AMQP_URL={url}: {e}"));
        let channel = connection.create_channel().await.expect("a channel");
        let name = common::unique_name("tidem_consumer_rabbitmq");
        let (options, arguments) = match kind {
            Kind::Classic => (QueueDeclareOptions::default(), FieldTable::default()),
            Kind::Quorum => {
                let mut arguments = FieldTable::default();
                arguments.insert(
                    "x-queue-type".into(),
                    AMQPValue::LongString("quorum".into()),
                );
                let durable = QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                };
                (durable, arguments)
            }
        };
        channel
            .queue_declare(name.as_str().into(), options, arguments)
            .await
            .expect("declare the queue");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        for (id, body) in messages {
            let mut properties = BasicProperties::default();
            if let Some(id) = id {
                properties = properties.with_message_id((*id).into());
            }
            channel
                .basic_publish(
                    "".into(),
                    name.as_str().into(),
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
        let deliveries = channel
            .basic_consume(
                name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        Self {
            connection,
            channel,
            name,
            deliveries,
        }
    }

    /// The next delivery, within 10 s, on the open channel.
    async fn next(&mut self) -> Delivery {
        tokio::time::timeout(Duration::from_secs(10), self.deliveries.next())
            .await
            .expect("a delivery within 10 s, while the channel stays open")
            .expect("the consumer is open")
            .expect("a delivery")
    }

    /// Check that every delivery was settled, then delete the queue and close the connection.
    async fn settled_then_deleted(self) {
        assert_eq!(rabbitmq_ready(&self.channel, &self.name).await, 0);
        self.channel
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await
            .expect("delete the queue");
        self.connection
            .close(200, "done".into())
            .await
            .expect("close");
    }
}

async fn effects(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(pool)
        .await
        .expect("effects")
}

#[tokio::test(flavor = "multi_thread")]
async fn deliveries_are_acked_after_the_commit_requeued_on_failure_parked_and_rejected_without_id()
{
    let (pool, _) = common::fresh_postgres().await;
    let ledger =
        PgConsumer::new(pool.clone(), "ledger").with_max_attempts(NonZeroU32::new(3).expect("3"));
    let mut queue = Queue::with(Kind::Classic, &common::MESSAGES).await;

    // ok once; poison three times (twice requeued, then parked and acked); no id once.
    let mut seen = Vec::new();
    let mut received = Vec::new();
    for _ in 0..5 {
        let delivery = queue.next().await;
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

    queue.settled_then_deleted().await;
    let parked = ledger.parked(10).await.expect("parked");
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].event_id, "evt_poison");
    assert_eq!(parked[0].payload.as_deref(), Some(&b"poison"[..]));
    assert_eq!(effects(&pool).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_work_that_panics_gives_its_delivery_back_at_once_and_the_redelivery_runs_it() {
    let (pool, _) = common::fresh_postgres().await;
    let ledger = PgConsumer::new(pool.clone(), "ledger");
    let mut queue = Queue::with(Kind::Classic, &[(Some("evt_ok"), "ok")]).await;

    let first = queue.next().await;
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

    let again = queue.next().await;
    assert!(
        again.redelivered,
        "the panicked delivery comes back flagged"
    );
    let handled =
        rabbitmq::process_delivery(&ledger, &again, common::record_unless_poison("ok".into()))
            .await
            .expect("settled with the broker");
    assert!(
        matches!(handled.result, Ok(Outcome::Processed(()))),
        "{handled:?}"
    );
    assert_eq!(
        effects(&pool).await,
        1,
        "the panicked attempt's write rolled back"
    );
    queue.settled_then_deleted().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quorum_queue_counts_each_delivery() {
    let (pool, _) = common::fresh_postgres().await;
    let ledger =
        PgConsumer::new(pool.clone(), "ledger").with_max_attempts(NonZeroU32::new(3).expect("3"));
    let mut queue = Queue::with(Kind::Quorum, &[(Some("evt_poison"), "poison")]).await;
    let mut counted = Vec::new();
    for _ in 0..3 {
        let delivery = queue.next().await;
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
    queue.settled_then_deleted().await;
}
