ALTER TABLE queue_entries DROP COLUMN drawn;
