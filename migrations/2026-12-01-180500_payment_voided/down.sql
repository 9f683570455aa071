UPDATE payments SET outcome = 'declined' WHERE outcome = 'voided';
ALTER TABLE payments DROP CONSTRAINT payments_outcome_check;
ALTER TABLE payments ADD CONSTRAINT payments_outcome_check
    CHECK (outcome IN ('pending', 'approved', 'declined'));
