-- tower-idempotency-consumer: failed attempts and parked (dead-lettered) events.
--
-- status      'processed' (the work committed), 'failed' (the work failed `attempts` times and
--             will run again on the next delivery) or 'parked' (it failed too often: deliveries
--             are acknowledged without running it until it is replayed)
-- attempts    how many times the work failed
-- last_error  the work's last error, as text
-- payload     the event's body when the consumer passed it, for replaying a parked event
--
-- processed_at is from now on the time of the row's last change (commit, failure or parking).
ALTER TABLE processed_events ADD COLUMN status TEXT NOT NULL DEFAULT 'processed';
ALTER TABLE processed_events ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE processed_events ADD COLUMN last_error TEXT;
ALTER TABLE processed_events ADD COLUMN payload BLOB;

CREATE INDEX IF NOT EXISTS processed_events_parked ON processed_events (consumer, processed_at)
    WHERE status = 'parked';
