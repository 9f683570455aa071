-- A purchase names its order on the key that guarded it, in the order's own
-- transaction: a replay is sent to that order, and the purchase needs no
-- second write to remember its answer.
ALTER TABLE idempotency_keys ADD COLUMN order_id BIGINT REFERENCES orders (id);
