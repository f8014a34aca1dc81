-- orders-api: the orders the idempotency layer protects (MySQL 8 / MariaDB, InnoDB).
--
-- order_id     an opaque id (a UUID string) chosen by the server
-- customer_id  who placed the order (1 to 255 characters, utf8mb4)
-- total_cents  the amount, in cents, at least 1
-- status       'pending' on creation
-- created_at   the database's clock at insert (UTC, microseconds)
CREATE TABLE IF NOT EXISTS orders (
    order_id    VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    customer_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    total_cents BIGINT       NOT NULL,
    status      VARCHAR(16)  CHARACTER SET ascii NOT NULL DEFAULT 'pending',
    created_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (order_id),
    INDEX orders_customer_id (customer_id, created_at),
    CONSTRAINT orders_customer_id_length CHECK (char_length(customer_id) BETWEEN 1 AND 255),
    CONSTRAINT orders_total_cents_positive CHECK (total_cents > 0)
) ENGINE = InnoDB;
