-- orders-api: the transactional outbox (PostgreSQL). With `OUTBOX=true`, each order inserts one
-- row here in the transaction that inserts the order and saves the idempotency answer, so the
-- event exists exactly when the order does. A relay publishes the rows and marks them.
--
-- event_id      the event's id: the order's id (one event per order)
-- kind          'order.created'
-- payload       the event: {"id", "orderId", "customerId", "amountCents"}
-- created_at    the database's clock at insert
-- published_at  set by the relay once the broker confirmed the message; NULL until then
CREATE TABLE IF NOT EXISTS outbox (
    event_id     text        PRIMARY KEY,
    kind         text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);

CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;
