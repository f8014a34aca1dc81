-- orders-api: the orders the idempotency layer protects.
--
-- order_id     an opaque id (a UUID string) chosen by the server
-- customer_id  who placed the order (1 to 255 characters)
-- total_cents  the amount, in cents, at least 1
-- status       'pending' on creation
-- created_at   the database's clock at insert (ISO 8601, UTC, milliseconds: sorts as text)
CREATE TABLE IF NOT EXISTS orders (
    order_id    TEXT    NOT NULL PRIMARY KEY,
    customer_id TEXT    NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 255),
    total_cents INTEGER NOT NULL CHECK (total_cents > 0),
    status      TEXT    NOT NULL DEFAULT 'pending',
    created_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

CREATE INDEX IF NOT EXISTS orders_customer_id ON orders (customer_id, created_at);
