-- Server-side sessions: the cookie carries a random 256-bit id, the database
-- only its SHA-256, so a leaked table cannot be replayed as cookies.
CREATE TABLE sessions (
    id_hash BYTEA PRIMARY KEY CHECK (octet_length(id_hash) = 32),
    customer_id BIGINT NOT NULL REFERENCES customers (id) ON DELETE CASCADE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);
CREATE INDEX sessions_customer_id ON sessions (customer_id);
CREATE INDEX sessions_expires_at ON sessions (expires_at);

-- One row per sign-in attempt that has not succeeded: written before the
-- password is checked (so parallel guesses count too) and deleted for the
-- account when it signs in. Rows older than the throttle window are purged.
CREATE TABLE login_attempts (
    id BIGSERIAL PRIMARY KEY,
    email TEXT NOT NULL,
    ip TEXT NOT NULL,
    attempted_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX login_attempts_email ON login_attempts (email, attempted_at);
CREATE INDEX login_attempts_ip ON login_attempts (ip, attempted_at);
CREATE INDEX login_attempts_attempted_at ON login_attempts (attempted_at);

-- Who did what in the admin console, and when.
CREATE TABLE admin_actions (
    id BIGSERIAL PRIMARY KEY,
    admin_id BIGINT NOT NULL REFERENCES customers (id),
    action TEXT NOT NULL CHECK (action IN ('refund', 'stock_adjust', 'gate_resync', 'sale_create', 'sale_edit')),
    product_id BIGINT REFERENCES products (id),
    order_id BIGINT REFERENCES orders (id),
    detail TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX admin_actions_created_at ON admin_actions (created_at DESC, id DESC);
