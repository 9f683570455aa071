DROP TABLE sandbox_charges;
DROP INDEX payments_one_pending_per_order;
DROP INDEX payments_attempt_key;
DELETE FROM payments WHERE outcome = 'pending';
ALTER TABLE payments DROP COLUMN settled_at;
ALTER TABLE payments DROP COLUMN attempt_key;
ALTER TABLE payments DROP CONSTRAINT payments_outcome_check;
ALTER TABLE payments ADD CONSTRAINT payments_outcome_check CHECK (outcome IN ('approved', 'declined'));
