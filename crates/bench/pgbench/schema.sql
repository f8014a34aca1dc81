-- The tables the pgbench scripts write: migrations 0001 and 0002 of the PostgreSQL store, the
-- bench handler's orders, and 10,000 saved answers for the replay scripts (keys 1 to 10000).
DROP TABLE IF EXISTS idempotency_records, bench_orders;
\ir ../../tower-idempotency/migrations/postgres/0001_idempotency_records.sql
\ir ../../tower-idempotency/migrations/postgres/0002_watched.sql
CREATE TABLE bench_orders (
    id          bigserial PRIMARY KEY,
    customer_id text      NOT NULL,
    total_cents bigint    NOT NULL
);
INSERT INTO idempotency_records
    (key, fingerprint, token, state, status, headers, body, created_at, lease_until, expires_at)
SELECT sha256(int8send(k)), sha256('fp'), md5(k::text)::uuid, 'done', 201,
       convert_to(E'content-type: application/json\n', 'UTF8'),
       '{"orderId":1,"customerId":"c_1","totalCents":4000,"status":"pending"}'::bytea,
       now(), now() + interval '30 seconds', now() + interval '1 day'
FROM generate_series(1, 10000) AS k;
VACUUM ANALYZE idempotency_records;
