DROP TABLE queue_admissions;
DROP TABLE queue_entries;
DROP TABLE queue_draws;
ALTER TABLE products DROP CONSTRAINT products_queue_opens_before_start;
ALTER TABLE products DROP CONSTRAINT products_queue_needs_limit;
ALTER TABLE products DROP COLUMN queue_opens_at;
ALTER TABLE products DROP COLUMN queue_mode;
