ALTER TABLE orders DROP COLUMN gate_key;
