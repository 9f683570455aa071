-- What each customer holds of each product: the units of their live orders
-- (awaiting payment or paid). A purchase reads its buyers' rows by primary
-- key under the product's row lock, so checking the per-customer limit
-- costs the same however much is already sold; the order's own statement
-- and every restore change the row in the same transaction as the order.
CREATE TABLE holdings (
    product_id BIGINT NOT NULL REFERENCES products (id) ON DELETE CASCADE,
    customer_id BIGINT NOT NULL REFERENCES customers (id) ON DELETE CASCADE,
    units INT NOT NULL,
    -- The product's per-customer limit when the units last grew (NULL: it
    -- had none). A purchase over the limit fails here even if the check
    -- before it were bypassed; a limit lowered later binds the next purchase.
    cap INT,
    PRIMARY KEY (product_id, customer_id),
    CONSTRAINT holdings_not_negative CHECK (units >= 0),
    CONSTRAINT holdings_within_limit CHECK (units <= cap)
);

-- What the live orders hold today. A limit lowered below what someone
-- already held is not theirs to lose: such a row starts without a cap.
INSERT INTO holdings (product_id, customer_id, units, cap)
SELECT i.product_id, o.customer_id, sum(i.quantity),
    CASE WHEN sum(i.quantity) <= p.per_customer_limit THEN p.per_customer_limit END
FROM order_items i
JOIN orders o ON o.id = i.order_id
JOIN products p ON p.id = i.product_id
WHERE o.status IN ('awaiting_payment', 'paid')
GROUP BY i.product_id, o.customer_id, p.per_customer_limit;
