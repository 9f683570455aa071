DROP INDEX queue_admissions_deadlines;
DROP INDEX queue_admissions_one_per_customer;
ALTER TABLE queue_admissions DROP COLUMN units, DROP COLUMN customer_id;
DROP SEQUENCE queue_entry_seq;
ALTER TABLE queue_entries DROP CONSTRAINT queue_entries_one_per_position, DROP COLUMN position;
ALTER TABLE queue_draws DROP CONSTRAINT queue_draws_frozen_with_list,
    DROP CONSTRAINT queue_draws_frozen_then_drawn,
    DROP COLUMN admission_paused, DROP COLUMN last_position,
    DROP COLUMN entries_sha256, DROP COLUMN frozen_at;
