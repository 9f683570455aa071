-- An attempt the provider had not decided when the settling job asked is
-- voided there, so it never charges. That is not a decline of the card:
-- the order may still be paid with another attempt before its deadline.
ALTER TABLE payments DROP CONSTRAINT payments_outcome_check;
ALTER TABLE payments ADD CONSTRAINT payments_outcome_check
    CHECK (outcome IN ('pending', 'approved', 'declined', 'voided'));
