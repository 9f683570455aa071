ALTER TABLE idempotency_keys DROP COLUMN order_id;
