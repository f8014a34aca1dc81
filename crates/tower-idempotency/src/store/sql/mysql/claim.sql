-- The claim of the MySQL store: parameters 1 key, 2 fingerprint, 3 token, 4 lease and
-- 5 retention (milliseconds). Valid on MySQL 8 and MariaDB 10.11.
--
-- No row with this key: the INSERT writes a running record. No LAST_INSERT_ID(expr) is
-- evaluated, so the statement's insert id is 0 (the table has no AUTO_INCREMENT column).
--
-- A row with this key: the UPDATE clause runs on the row's latest committed version, under an
-- exclusive lock on its primary-key entry. Its first assignment computes the outcome from the
-- row as it was and keeps it with LAST_INSERT_ID(code): the server returns that value as the
-- statement's insert id (in the OK packet: no second statement), and LAST_INSERT_ID() returns
-- it to the later assignments of the same statement. The codes:
--   1  expired: claimed afresh, by any fingerprint
--   2  running, lease lapsed, same fingerprint: taken over (new token and lease, original
--      created_at and expires_at, the latter moved to the new lease's end if that is later:
--      a record does not expire under a live holder)
--   3  another fingerprint: mismatch
--   4  done: the store reads the saved response with its consistent read
--   5 + the lease left in milliseconds: running under a valid lease, in flight
-- Each assignment after the first reads only its own column's old value and the code, so the
-- left-to-right evaluation of SET assignments cannot leak a new value into a decision. For
-- codes 3 to 5 every column keeps its value: the row is not changed.
--
-- Why exactly one of any number of concurrent attempts wins, under InnoDB: a duplicate-key
-- INSERT .. ON DUPLICATE KEY UPDATE takes an exclusive (next-key) lock on the existing index
-- record before it evaluates the UPDATE clause, and an UPDATE reads the latest committed row
-- version, not the statement's snapshot, at the read-committed and repeatable-read isolation
-- levels alike.
-- Attempts on one key are therefore serialised on that lock: the first inserts (or updates)
-- and commits at the end of its statement (autocommit), and the next one evaluates the UPDATE
-- clause on the row the first wrote, finds it running under a valid lease, and writes nothing.
-- On a new key, the first INSERT holds an exclusive lock on the record it created; the others
-- find the duplicate and queue for that lock with exclusive requests (not the shared lock of
-- a plain INSERT), then update in turn. Should InnoDB still pick one as a deadlock victim
-- (1213, which gap locks under REPEATABLE READ can cause), that statement wrote nothing and
-- is retried. No lock outlives the statement.
--
-- VALUES(col) names the value the INSERT would have written: both databases accept it (MySQL
-- 8.0.20 deprecates it for a row alias, which MariaDB lacks). Both evaluate UTC_TIMESTAMP(6)
-- once per statement, so VALUES(created_at) is this statement's clock throughout: milliseconds
-- since the Unix epoch, independent of the session's time_zone.
INSERT INTO idempotency_records
    (`key`, fingerprint, token, state, created_at, lease_until, expires_at)
VALUES (?, ?, ?, 'running',
    CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED),
    CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED) + ?,
    CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED) + ?)
ON DUPLICATE KEY UPDATE
    token = IF(LAST_INSERT_ID(CASE
                   WHEN expires_at <= VALUES(created_at) THEN 1
                   WHEN fingerprint <> VALUES(fingerprint) THEN 3
                   WHEN state = 'done' THEN 4
                   WHEN lease_until <= VALUES(created_at) THEN 2
                   ELSE 5 + lease_until - VALUES(created_at) END) <= 2,
               VALUES(token), token),
    fingerprint = IF(LAST_INSERT_ID() = 1, VALUES(fingerprint), fingerprint),
    state       = IF(LAST_INSERT_ID() = 1, 'running', state),
    status      = IF(LAST_INSERT_ID() = 1, NULL, status),
    headers     = IF(LAST_INSERT_ID() = 1, NULL, headers),
    body        = IF(LAST_INSERT_ID() = 1, NULL, body),
    created_at  = IF(LAST_INSERT_ID() = 1, VALUES(created_at), created_at),
    lease_until = IF(LAST_INSERT_ID() <= 2, VALUES(lease_until), lease_until),
    expires_at  = IF(LAST_INSERT_ID() = 1, VALUES(expires_at),
                     IF(LAST_INSERT_ID() = 2, GREATEST(expires_at, VALUES(lease_until)), expires_at))
