ALTER TABLE products DROP COLUMN fence;
