-- The shop's ledger. Postgres is the single source of truth for stock:
-- every change to products.stock is paired with exactly one stock_history row
-- written in the same transaction, so the audit can replay the ledger.

CREATE TABLE customers (
    id            BIGSERIAL PRIMARY KEY,
    -- stored lower-cased by the application so the unique index is case-insensitive
    email         TEXT        NOT NULL UNIQUE CHECK (email = lower(email) AND length(email) BETWEEN 3 AND 254),
    password_hash TEXT        NOT NULL,
    role          TEXT        NOT NULL DEFAULT 'customer' CHECK (role IN ('customer', 'admin')),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE products (
    id                 BIGSERIAL PRIMARY KEY,
    name               TEXT        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    description        TEXT        NOT NULL DEFAULT '',
    price_cents        BIGINT      NOT NULL CHECK (price_cents >= 0),
    -- last line of defence against overselling
    stock              INTEGER     NOT NULL CHECK (stock >= 0),
    initial_stock      INTEGER     NOT NULL CHECK (initial_stock >= 0),
    per_customer_limit INTEGER     CHECK (per_customer_limit > 0),
    sale_starts_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    sale_ends_at       TIMESTAMPTZ,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (sale_ends_at IS NULL OR sale_ends_at > sale_starts_at)
);

CREATE TABLE orders (
    id               BIGSERIAL PRIMARY KEY,
    customer_id      BIGINT      NOT NULL REFERENCES customers (id),
    status           TEXT        NOT NULL CHECK (status IN ('awaiting_payment', 'paid', 'payment_failed', 'expired', 'refunded')),
    total_cents      BIGINT      NOT NULL CHECK (total_cents >= 0),
    payment_deadline TIMESTAMPTZ NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX orders_customer_idx ON orders (customer_id, created_at DESC);
CREATE INDEX orders_awaiting_deadline_idx ON orders (payment_deadline) WHERE status = 'awaiting_payment';

CREATE TABLE order_items (
    id               BIGSERIAL PRIMARY KEY,
    order_id         BIGINT  NOT NULL REFERENCES orders (id),
    product_id       BIGINT  NOT NULL REFERENCES products (id),
    quantity         INTEGER NOT NULL CHECK (quantity > 0),
    unit_price_cents BIGINT  NOT NULL CHECK (unit_price_cents >= 0),
    UNIQUE (order_id, product_id)
);
CREATE INDEX order_items_product_idx ON order_items (product_id);

CREATE TABLE stock_history (
    id          BIGSERIAL PRIMARY KEY,
    product_id  BIGINT      NOT NULL REFERENCES products (id),
    order_id    BIGINT      REFERENCES orders (id),
    delta       INTEGER     NOT NULL CHECK (delta <> 0),
    stock_after INTEGER     NOT NULL CHECK (stock_after >= 0),
    reason      TEXT        NOT NULL CHECK (reason IN ('purchase', 'payment_failed', 'expired', 'refund', 'admin_adjust')),
    note        TEXT        NOT NULL DEFAULT '',
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((reason = 'admin_adjust') = (order_id IS NULL)),
    CHECK (reason = 'admin_adjust' OR (reason = 'purchase') = (delta < 0))
);
CREATE INDEX stock_history_product_idx ON stock_history (product_id, id);
-- An order takes a product's units once and gives them back at most once:
-- the database itself refuses a double restore.
CREATE UNIQUE INDEX stock_history_one_take_per_item ON stock_history (order_id, product_id) WHERE reason = 'purchase';
CREATE UNIQUE INDEX stock_history_one_restore_per_item ON stock_history (order_id, product_id)
    WHERE reason IN ('payment_failed', 'expired', 'refund');

CREATE TABLE payments (
    id           BIGSERIAL PRIMARY KEY,
    order_id     BIGINT      NOT NULL REFERENCES orders (id),
    outcome      TEXT        NOT NULL CHECK (outcome IN ('approved', 'declined')),
    amount_cents BIGINT      NOT NULL CHECK (amount_cents >= 0),
    card_last4   TEXT        NOT NULL CHECK (card_last4 ~ '^[0-9]{4}$'),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX payments_order_idx ON payments (order_id);
CREATE UNIQUE INDEX payments_one_approval_per_order ON payments (order_id) WHERE outcome = 'approved';
