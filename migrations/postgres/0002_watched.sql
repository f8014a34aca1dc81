-- tower-idempotency: wait-mode notifications only for records someone waits on.
--
-- watched      set by a duplicate that waits for the running attempt (wait mode); only a
--              watched record's completion or release sends a NOTIFY, so the default path never
--              pays for PostgreSQL's notify lock at commit
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS watched boolean NOT NULL DEFAULT false;
