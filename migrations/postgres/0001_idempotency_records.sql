-- tower-idempotency: one row per scoped Idempotency-Key.
--
-- key          sha256(scope || Idempotency-Key), never the raw key
-- fingerprint  sha256 of the request the key is bound to
-- token        fencing token of the current holder; every later write is checked against it
-- state        'running' while a holder works, 'done' once its response is saved
-- status, headers, body
--              the saved response (headers as "name: value\n" lines); NULL while running
-- lease_until  a running record whose lease has passed may be taken over
-- expires_at   the record is kept until then (counted from the claim), then swept
CREATE TABLE IF NOT EXISTS idempotency_records (
    key         bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    token       uuid        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('running', 'done')),
    status      integer     CHECK (status BETWEEN 100 AND 999),
    headers     bytea,
    body        bytea,
    created_at  timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    CHECK ((state = 'done') = (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL))
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);
