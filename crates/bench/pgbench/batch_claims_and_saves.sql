-- Group commit's one statement for a batch (pgbench -D batch=N -D prev=0): N first-time claims
-- and the saves of the N requests of the client's previous batch, in one statement and one
-- commit, as the PostgreSQL store ran them before the insert-first claim (CLAIM_AND_COMPLETE_MANY in
-- crates/tower-idempotency/src/store/sql/postgres/batch.rs, with the arrays built by the
-- server instead of bound). Each transaction serves N requests' claim and save: tps x N is
-- claim+save pairs per second. The first transaction of a client saves nothing (prev=0).
\set k random(1, 4000000000000000000)
WITH 
saved AS (
    UPDATE idempotency_records AS s
    SET state = 'done', status = u.status, headers = u.headers, body = u.body
    FROM unnest(ARRAY(SELECT sha256(int8send(:prev::bigint) || int4send(g)) FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT md5(:prev::text || '-' || g)::uuid FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT 201 FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT convert_to(E'content-type: application/json\n', 'UTF8') FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT '{"orderId":1,"customerId":"c_1","totalCents":4000,"status":"pending"}'::bytea FROM generate_series(1, :batch::int) AS g))
        WITH ORDINALITY AS u(key, token, status, headers, body, n)
    WHERE s.key = u.key AND s.token = u.token AND s.state = 'running'
    RETURNING u.n, s.watched
),
input AS (
    SELECT *
    FROM unnest(ARRAY(SELECT sha256(int8send(:k::bigint) || int4send(g)) FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT sha256('fp'::bytea) FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT md5(:k::text || '-' || g)::uuid FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT 30000::bigint FROM generate_series(1, :batch::int) AS g), ARRAY(SELECT 86400000::bigint FROM generate_series(1, :batch::int) AS g))
        WITH ORDINALITY AS i(key, fingerprint, token, lease_ms, ttl_ms, n)
),
live AS (
    SELECT i.n, l.fingerprint <> i.fingerprint AS mismatch, l.state, l.status, l.headers,
           l.body, l.lease_until
    FROM input AS i
    CROSS JOIN LATERAL (
        SELECT * FROM idempotency_records AS l WHERE l.key = i.key OFFSET 0
    ) AS l
    WHERE l.expires_at > now()
      AND (l.fingerprint <> i.fingerprint OR l.state = 'done' OR l.lease_until > now())
),
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        i.key, i.fingerprint, i.token, 'running', now(),
        now() + i.lease_ms * interval '1 millisecond',
        now() + i.ttl_ms * interval '1 millisecond'
    FROM input AS i
    WHERE NOT EXISTS (SELECT FROM live WHERE live.n = i.n)
    ORDER BY i.key
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
    SELECT i.n, e.fingerprint <> i.fingerprint AS mismatch, e.state, e.status, e.headers,
           e.body, e.lease_until
    FROM input AS i
    JOIN idempotency_records AS e ON e.key = i.key
    WHERE NOT EXISTS (SELECT FROM live WHERE live.n = i.n)
      AND NOT EXISTS (SELECT FROM claimed WHERE claimed.key = i.key)
    FOR SHARE OF e
),
found AS (
    SELECT * FROM live
    UNION ALL
    SELECT * FROM existing
)
SELECT i.n, 'claimed' AS outcome, c.taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed AS c
JOIN input AS i ON i.key = c.key
UNION ALL
SELECT n,
       CASE WHEN mismatch THEN 'mismatch' WHEN state = 'done' THEN 'done' ELSE 'in_flight' END,
       false,
       greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint,
       status, headers, body
FROM found
UNION ALL
SELECT n, 'saved', watched, NULL::bigint, NULL::integer, NULL::bytea, NULL::bytea
FROM saved;
\set prev :k
