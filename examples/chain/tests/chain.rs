//! The chain end to end (`order_chain::run`): 1,000 orders through a proxy that loses 20% of the
//! answers, the outbox relayed to RabbitMQ by a relay SIGKILLed three times between a confirm
//! and its mark, and consumed by a consumer SIGKILLed three times mid-stream. At the end every
//! intent has one order, every order one effect.
//!
//! Needs PostgreSQL at `DATABASE_URL` and RabbitMQ at `AMQP_URL`: two databases and a queue of
//! its own.

use order_chain::{Settings, DEADLINE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_is_one_order_and_every_order_one_effect() {
    let settings = Settings::new(
        env!("CARGO_BIN_EXE_chain-relay"),
        env!("CARGO_BIN_EXE_chain-consumer"),
    );
    let report = order_chain::run(&settings).await.expect("the chain runs");
    // Shown with --no-capture; the README quotes it.
    println!("{report}");

    // The faults happened, on every hop.
    assert!(
        report.answers_lost > 0,
        "the proxy lost answers: {report:?}"
    );
    assert!(
        report.attempts > report.intents as u64,
        "lost answers were retried: {report:?}"
    );
    assert_eq!(report.relay_kills, settings.relay_kills);
    assert!(
        report.republished > 0,
        "a killed relay's confirmed batch was published again: {report:?}"
    );
    assert_eq!(report.consumer_kills, settings.consumer_kills);
    assert!(
        report.consumer.redelivered > 0,
        "killed consumers' deliveries came back: {report:?}"
    );
    assert!(
        report.consumer.duplicate > 0,
        "copies reached the consumer and were absorbed: {report:?}"
    );

    // orders = intents.
    assert_eq!(report.created, report.intents, "every intent got its 201");
    assert_eq!(report.orders, report.intents, "one order per intent");
    assert_eq!(report.duplicate_orders, 0, "no intent made two orders");
    assert_eq!(report.events, report.orders, "one outbox event per order");
    assert_eq!(report.unpublished, 0, "every event was published");
    assert_eq!(
        report.confirmed,
        report.events + report.republished,
        "every event confirmed once, the killed batches twice"
    );

    // effects = orders, duplicates 0.
    assert_eq!(report.effects, report.orders, "one effect per order");
    assert_eq!(report.applied_twice, 0, "no event applied twice");
    assert_eq!(report.lost, 0, "no order without its effect");
    assert_eq!(report.strangers, 0, "no effect without its order");
    assert_eq!(
        report.wrong_amounts, 0,
        "each effect carries its order's total"
    );
    assert_eq!(
        report.processed_marks, report.orders,
        "one processed mark per event, none failed or parked"
    );
    // A run killed after a commit but before its `settled` line loses the line, not the
    // effect: the redelivery reports a duplicate. So the lines count at most one per order.
    assert!(
        report.consumer.applied <= report.orders,
        "no event reported applied twice: {report:?}"
    );
    assert_eq!(report.consumer.other, 0, "no delivery failed or was parked");
    assert_eq!(report.left_in_queue, 0, "every message was acknowledged");
    assert!(report.elapsed < DEADLINE);
}
