-- Group commit's statements for one batch of :batch first-time keys (pgbench -D batch=N): one
-- claim of N keys, committed, then one save of N answers, committed; two commits for N
-- requests instead of 2N. The claim is first_standard.sql's (live read first, then the insert,
-- then a shared-lock read of what the insert did not take) for N entries at once, each entry
-- answered with its own outcome; the save checks each entry's fencing token.
--
-- The arrays are what the store binds as parameters ($1::bytea[], ...); here the server builds
-- them from generate_series, so pgbench sends a few bytes instead of about 80 per entry.
\set k random(1, 4000000000000000000)
\set t random(1, 9000000000000000000)
WITH input AS (
    SELECT i.key, i.fingerprint, i.token, i.n
    FROM unnest(
        ARRAY(SELECT sha256(int8send(:k::bigint) || int4send(g)) FROM generate_series(1, :batch::int) AS g),
        ARRAY(SELECT sha256('fp'::bytea) FROM generate_series(1, :batch::int) AS g),
        ARRAY(SELECT md5(:t::text || '-' || g)::uuid FROM generate_series(1, :batch::int) AS g)
    ) WITH ORDINALITY AS i(key, fingerprint, token, n)
),
live AS (
    SELECT l.key, l.fingerprint, l.state, l.status, l.headers, l.body, l.lease_until
    FROM idempotency_records AS l
    JOIN input ON input.key = l.key
    WHERE l.expires_at > now()
      AND (l.fingerprint <> input.fingerprint OR l.state = 'done' OR l.lease_until > now())
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        input.key, input.fingerprint, input.token, 'running', now(),
        now() + 30000 * interval '1 millisecond',
        now() + 86400000 * interval '1 millisecond'
    FROM input
    WHERE NOT EXISTS (SELECT FROM live WHERE live.key = input.key)
    -- One lock order for every batch: two batches never wait on each other in a cycle.
    ORDER BY input.key
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
    RETURNING r.key, r.created_at <> now() AS taken_over
),
existing AS (
    SELECT e.key, e.fingerprint, e.state, e.status, e.headers, e.body, e.lease_until
    FROM idempotency_records AS e
    JOIN input ON input.key = e.key
    WHERE NOT EXISTS (SELECT FROM live WHERE live.key = input.key)
      AND NOT EXISTS (SELECT FROM claimed WHERE claimed.key = input.key)
    FOR SHARE OF e
),
found AS (
    SELECT * FROM live
    UNION ALL
    SELECT * FROM existing
)
SELECT input.n,
       CASE WHEN c.key IS NOT NULL THEN 'claimed'
            WHEN f.fingerprint <> input.fingerprint THEN 'mismatch'
            WHEN f.state = 'done' THEN 'done'
            ELSE 'in_flight' END AS outcome,
       coalesce(c.taken_over, false) AS taken_over,
       greatest(0, ceil(extract(epoch FROM f.lease_until - now()) * 1000))::bigint AS lease_remaining_ms,
       f.status, f.headers, f.body
FROM input
LEFT JOIN claimed AS c ON c.key = input.key
LEFT JOIN found AS f ON f.key = input.key
ORDER BY input.n;
UPDATE idempotency_records AS r
SET state = 'done', status = s.status, headers = s.headers, body = s.body
FROM unnest(
    ARRAY(SELECT sha256(int8send(:k::bigint) || int4send(g)) FROM generate_series(1, :batch::int) AS g),
    ARRAY(SELECT md5(:t::text || '-' || g)::uuid FROM generate_series(1, :batch::int) AS g),
    ARRAY(SELECT 201 FROM generate_series(1, :batch::int) AS g),
    ARRAY(SELECT convert_to(E'content-type: application/json\n', 'UTF8') FROM generate_series(1, :batch::int) AS g),
    ARRAY(SELECT '{"orderId":1,"customerId":"c_1","totalCents":4000,"status":"pending"}'::bytea
          FROM generate_series(1, :batch::int) AS g)
) AS s(key, token, status, headers, body)
WHERE r.key = s.key AND r.token = s.token AND r.state = 'running'
RETURNING r.key, r.watched;
