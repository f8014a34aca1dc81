-- tower-idempotency-consumer: one row per event a consumer has processed.
--
-- consumer      the name of the consumer (one queue handler or webhook endpoint)
-- event_id      the event's id as the provider sends it
-- processed_at  when the work committed, by the database's clock; the sweep deletes by it
--
-- The row is inserted in the work's own transaction: it exists if and only if the work committed.
CREATE TABLE IF NOT EXISTS processed_events (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

CREATE INDEX IF NOT EXISTS processed_events_processed_at ON processed_events (processed_at);
