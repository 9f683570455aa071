-- The waiting room (issue #16). A sale in queue mode lets customers join a
-- pre-queue from `queue_opens_at`; at the start they are put in an order
-- anyone can recompute from the revealed seed, and admitted in that order
-- with passes that never cover more units than are left. Redis runs the
-- queue; these tables are what it is rebuilt from and what the draw is
-- audited against.
ALTER TABLE products ADD COLUMN queue_mode BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE products ADD COLUMN queue_opens_at TIMESTAMPTZ;
-- A queue admits per pass the customer's limit, so it needs one.
ALTER TABLE products ADD CONSTRAINT products_queue_needs_limit
    CHECK (NOT queue_mode OR per_customer_limit IS NOT NULL);
ALTER TABLE products ADD CONSTRAINT products_queue_opens_before_start
    CHECK (queue_opens_at IS NULL OR queue_opens_at <= sale_starts_at);

-- The seed is committed to (its SHA-256 published) when the pre-queue
-- opens, and served only once `drawn_at` is set.
CREATE TABLE queue_draws (
    product_id   BIGINT PRIMARY KEY REFERENCES products (id),
    seed         BYTEA       NOT NULL CHECK (length(seed) = 32),
    seed_sha256  BYTEA       NOT NULL CHECK (length(seed_sha256) = 32),
    committed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    drawn_at     TIMESTAMPTZ
);

-- One place per customer per sale. `seq` is the arrival order; `late`
-- entries (joined at or after the start) follow the drawn ones in `seq`
-- order.
CREATE TABLE queue_entries (
    product_id  BIGINT      NOT NULL REFERENCES products (id),
    customer_id BIGINT      NOT NULL REFERENCES customers (id),
    ticket      TEXT        NOT NULL CHECK (ticket ~ '^[0-9A-HJKMNP-TV-Z]{10}$'),
    seq         BIGINT      NOT NULL CHECK (seq > 0),
    joined_at   TIMESTAMPTZ NOT NULL,
    late        BOOLEAN     NOT NULL,
    PRIMARY KEY (product_id, customer_id),
    UNIQUE (product_id, ticket),
    UNIQUE (product_id, seq)
);

-- Each pass issued, numbered in issue order per sale: the n-th admission
-- must go to the n-th ticket of the published order.
CREATE TABLE queue_admissions (
    product_id BIGINT      NOT NULL REFERENCES products (id),
    number     INT         NOT NULL CHECK (number > 0),
    ticket     TEXT        NOT NULL,
    issued_at  TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    state      TEXT        NOT NULL DEFAULT 'issued' CHECK (state IN ('issued', 'used', 'lapsed')),
    order_id   BIGINT REFERENCES orders (id),
    ended_at   TIMESTAMPTZ,
    PRIMARY KEY (product_id, number),
    UNIQUE (product_id, ticket),
    FOREIGN KEY (product_id, ticket) REFERENCES queue_entries (product_id, ticket),
    CHECK ((state = 'used') = (order_id IS NOT NULL)),
    CHECK ((state = 'issued') = (ended_at IS NULL))
);
CREATE INDEX queue_admissions_open ON queue_admissions (product_id) WHERE state = 'issued';
