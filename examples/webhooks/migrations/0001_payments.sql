-- webhooks-example: what the payment events add up to, one row per payment.
--
-- Every event adds to a payment's totals, so the state does not depend on the order events
-- arrive in; it is only right if each event is applied once.
CREATE TABLE IF NOT EXISTS payments (
    payment_id     TEXT    NOT NULL PRIMARY KEY,
    captured_cents INTEGER NOT NULL DEFAULT 0,
    refunded_cents INTEGER NOT NULL DEFAULT 0,
    events         INTEGER NOT NULL DEFAULT 0
) STRICT;
