-- tower-idempotency: one row per scoped Idempotency-Key.
--
-- key          sha256(scope || Idempotency-Key), never the raw key
-- fingerprint  sha256 of the request the key is bound to
-- token        fencing token (a UUID, 16 bytes) of the current holder
-- state        'running' while a holder works, 'done' once its response is saved
-- status, headers, body
--              the saved response (headers as "name: value\n" lines); NULL while running
-- created_at, lease_until, expires_at
--              milliseconds since the Unix epoch, by SQLite's clock
-- lease_until  a running record whose lease has passed may be taken over
-- expires_at   the record is kept until then (counted from the claim), then swept
CREATE TABLE IF NOT EXISTS idempotency_records (
    key         BLOB    NOT NULL PRIMARY KEY CHECK (length(key) = 32),
    fingerprint BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    token       BLOB    NOT NULL CHECK (length(token) = 16),
    state       TEXT    NOT NULL CHECK (state IN ('running', 'done')),
    status      INTEGER CHECK (status BETWEEN 100 AND 999),
    headers     BLOB,
    body        BLOB,
    created_at  INTEGER NOT NULL,
    lease_until INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    CHECK ((state = 'done') = (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL))
) STRICT;

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);
