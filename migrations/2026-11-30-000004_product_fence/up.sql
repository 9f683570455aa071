-- The fencing token of the last lock holder that wrote this product's stock.
-- A write carries its holder's token and is refused unless the token is newer.
ALTER TABLE products ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
