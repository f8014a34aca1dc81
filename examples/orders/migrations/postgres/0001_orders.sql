-- orders-api: the orders the idempotency layer protects.
--
-- order_id     an opaque id (a UUID string) chosen by the server
-- customer_id  who placed the order (1 to 255 characters)
-- total_cents  the amount, in cents, at least 1
-- status       'pending' on creation
-- created_at   the database's clock at insert
CREATE TABLE IF NOT EXISTS orders (
    order_id    text        PRIMARY KEY,
    customer_id text        NOT NULL CHECK (length(customer_id) BETWEEN 1 AND 255),
    total_cents bigint      NOT NULL CHECK (total_cents > 0),
    status      text        NOT NULL DEFAULT 'pending',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS orders_customer_id ON orders (customer_id, created_at);
