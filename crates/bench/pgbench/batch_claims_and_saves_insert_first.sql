-- batch_claims_and_saves.sql with the claim's insert first: `INSERT .. ON CONFLICT DO NOTHING`
-- claims every new key, and only the entries it did not insert read their record (a done,
-- in-flight or mismatched answer; an expired record or a lapsed lease answers 'again', which the
-- store's next round claims with the full statement). pgbench -D batch=N -D prev=0.
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
claimed AS (
    INSERT INTO idempotency_records AS r
        (key, fingerprint, token, state, created_at, lease_until, expires_at)
    SELECT
        i.key, i.fingerprint, i.token, 'running', now(),
        now() + i.lease_ms * interval '1 millisecond',
        now() + i.ttl_ms * interval '1 millisecond'
    FROM input AS i
    ORDER BY i.key
    ON CONFLICT (key) DO NOTHING
    RETURNING r.key
)
SELECT i.n, 'claimed' AS outcome, false AS taken_over, NULL::bigint AS lease_remaining_ms,
       NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body
FROM claimed AS c
JOIN input AS i ON i.key = c.key
UNION ALL
SELECT i.n,
       CASE WHEN e.expires_at <= now() THEN 'again'
            WHEN e.fingerprint <> i.fingerprint THEN 'mismatch'
            WHEN e.state = 'done' THEN 'done'
            WHEN e.lease_until > now() THEN 'in_flight'
            ELSE 'again' END,
       false,
       greatest(0, ceil(extract(epoch FROM e.lease_until - now()) * 1000))::bigint,
       e.status, e.headers, e.body
FROM input AS i
CROSS JOIN LATERAL (
    SELECT * FROM idempotency_records AS e WHERE e.key = i.key OFFSET 0
) AS e
WHERE NOT EXISTS (SELECT FROM claimed WHERE claimed.key = i.key)
UNION ALL
SELECT n, 'saved', watched, NULL::bigint, NULL::integer, NULL::bytea, NULL::bytea
FROM saved;
\set prev :k
