-- First-time key, standard mode: the claim (live read first), then the handler's INSERT and
-- the save, each committed on its own (three commits, no transaction held across them).
\set k random(100000, 9000000000000000000)
\set t random(1, 9000000000000000000)
WITH live AS (
    SELECT l.fingerprint, l.state, l.status, l.headers, l.body, l.lease_until
    FROM idempotency_records AS l
    WHERE l.key = sha256(int8send(:k::bigint))
      AND l.expires_at > now()
      AND (l.fingerprint <> sha256('fp') OR l.state = 'done' OR l.lease_until > now())
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        sha256(int8send(:k::bigint)), sha256('fp'), md5(:t::text)::uuid, 'running', now(),
        now() + 30000 * interval '1 millisecond',
        now() + 86400000 * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT FROM live)
    ON CONFLICT (key) DO UPDATE SET
        fingerprint = EXCLUDED.fingerprint,
        token       = EXCLUDED.token,
        state       = 'running',
        status      = NULL,
        headers     = NULL,
        body        = NULL,
        lease_until = EXCLUDED.lease_until,
        watched     = r.watched AND r.expires_at > now(),
        created_at  = CASE WHEN r.expires_at <= now() THEN EXCLUDED.created_at ELSE r.created_at END,
        expires_at  = CASE WHEN r.expires_at <= now() THEN EXCLUDED.expires_at ELSE r.expires_at END
    WHERE r.expires_at <= now()
       OR (r.state = 'running' AND r.lease_until <= now() AND r.fingerprint = EXCLUDED.fingerprint)
    RETURNING r.created_at <> now() AS taken_over
),
existing AS (
    SELECT e.fingerprint, e.state, e.status, e.headers, e.body, e.lease_until
    FROM idempotency_records AS e
    WHERE e.key = sha256(int8send(:k::bigint))
      AND NOT EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM claimed)
    FOR SHARE
),
found AS (
    SELECT * FROM live
    UNION ALL
    SELECT * FROM existing
)
SELECT 'claimed' AS outcome, taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed
UNION ALL
SELECT CASE WHEN fingerprint <> sha256('fp') THEN 'mismatch'
            WHEN state = 'done' THEN 'done'
            ELSE 'in_flight' END,
       false,
       greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint,
       status, headers, body
FROM found;
INSERT INTO bench_orders (customer_id, total_cents) VALUES ('c_1', 4000) RETURNING id;
UPDATE idempotency_records
SET state = 'done', status = 201, headers = convert_to(E'content-type: application/json\n', 'UTF8'),
    body = '{"orderId":1,"customerId":"c_1","totalCents":4000,"status":"pending"}'::bytea
WHERE key = sha256(int8send(:k::bigint)) AND token = md5(:t::text)::uuid AND state = 'running'
RETURNING watched;
