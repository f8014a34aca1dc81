-- The floor, not a usable claim: a plain INSERT .. ON CONFLICT DO NOTHING (it cannot answer
-- in flight, mismatch or done), then the same transaction.
\set k random(100000, 9000000000000000000)
\set t random(1, 9000000000000000000)
INSERT INTO idempotency_records
    (key, fingerprint, token, state, created_at, lease_until, expires_at)
VALUES (sha256(int8send(:k::bigint)), sha256('fp'), md5(:t::text)::uuid, 'running', now(),
        now() + interval '30 seconds', now() + interval '1 day')
ON CONFLICT (key) DO NOTHING;
BEGIN;
INSERT INTO bench_orders (customer_id, total_cents) VALUES ('c_1', 4000) RETURNING id;
UPDATE idempotency_records
SET state = 'done', status = 201, headers = convert_to(E'content-type: application/json\n', 'UTF8'),
    body = '{"orderId":1,"customerId":"c_1","totalCents":4000,"status":"pending"}'::bytea
WHERE key = sha256(int8send(:k::bigint)) AND token = md5(:t::text)::uuid AND state = 'running'
RETURNING watched;
COMMIT;
