-- A payment is two steps around the provider's call: the attempt is
-- recorded ('pending', with the key the provider deduplicates on) and
-- committed before the call; its result is recorded in a second
-- transaction. An attempt whose result never came is settled later by
-- asking the provider about its key.
ALTER TABLE payments DROP CONSTRAINT payments_outcome_check;
ALTER TABLE payments ADD CONSTRAINT payments_outcome_check
    CHECK (outcome IN ('pending', 'approved', 'declined'));
ALTER TABLE payments ADD COLUMN attempt_key TEXT;
ALTER TABLE payments ADD COLUMN settled_at TIMESTAMPTZ;
UPDATE payments SET attempt_key = 'legacy-' || id, settled_at = created_at;
ALTER TABLE payments ALTER COLUMN attempt_key SET NOT NULL;
CREATE UNIQUE INDEX payments_attempt_key ON payments (attempt_key);
-- One attempt in flight per order: a second one waits for the first's result.
CREATE UNIQUE INDEX payments_one_pending_per_order ON payments (order_id) WHERE outcome = 'pending';

-- The sandbox provider's own books: what a real provider keeps on its side,
-- so a lookup by attempt key answers after a lost reply or a restart.
CREATE TABLE sandbox_charges (
    attempt_key  TEXT PRIMARY KEY,
    approved     BOOLEAN     NOT NULL,
    reason       TEXT        NOT NULL DEFAULT '',
    amount_cents BIGINT      NOT NULL CHECK (amount_cents >= 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Fingerprints were plain SHA-256 over text that holds the card number; a
-- payment's can be reversed by trying card numbers. Keys now carry keyed
-- fingerprints (`h1:`); the plain ones of payments are scrubbed (a resend of
-- such a form is refused as a conflicting reuse, never charged twice).
UPDATE idempotency_keys SET fingerprint = 'scrubbed'
WHERE fingerprint NOT LIKE 'h1:%' AND order_id IS NULL;
