-- tower-idempotency: one row per scoped Idempotency-Key (MySQL 8 / MariaDB 10.11, InnoDB).
--
-- key          sha256(scope || Idempotency-Key), never the raw key (`key` is a reserved word:
--              always quote it with backticks)
-- fingerprint  sha256 of the request the key is bound to
-- token        fencing token (a UUID, 16 bytes) of the current holder
-- state        'running' while a holder works, 'done' once its response is saved
-- status, headers, body
--              the saved response (headers as "name: value\n" lines); NULL while running
-- created_at, lease_until, expires_at
--              milliseconds since the Unix epoch, by the database's clock (UTC_TIMESTAMP(6)):
--              integers, not DATETIME(6), so no session time_zone can shift them, and lease
--              arithmetic is exact in one expression on MySQL and MariaDB alike
-- lease_until  a running record whose lease has passed may be taken over
-- expires_at   the record is kept until then (counted from the claim), then swept
CREATE TABLE IF NOT EXISTS idempotency_records (
    `key`       BINARY(32)  NOT NULL,
    fingerprint BINARY(32)  NOT NULL,
    token       BINARY(16)  NOT NULL,
    state       VARCHAR(7)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status      SMALLINT,
    headers     MEDIUMBLOB,
    body        LONGBLOB,
    created_at  BIGINT      NOT NULL,
    lease_until BIGINT      NOT NULL,
    expires_at  BIGINT      NOT NULL,
    PRIMARY KEY (`key`),
    INDEX idempotency_records_expires_at (expires_at),
    CONSTRAINT idempotency_records_state CHECK (state IN ('running', 'done')),
    CONSTRAINT idempotency_records_status CHECK (status BETWEEN 100 AND 999),
    CONSTRAINT idempotency_records_saved
        CHECK ((state = 'done') = (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL))
) ENGINE = InnoDB;
