-- One row per (customer, key) of a state-changing request. The row is claimed
-- before the request runs and holds its answer afterwards, so a replay gets the
-- same answer and never a second execution.
CREATE TABLE idempotency_keys (
    customer_id     BIGINT      NOT NULL REFERENCES customers (id),
    key             TEXT        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint     TEXT        NOT NULL,
    response_status SMALLINT,
    response_location TEXT,
    response_body   TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (customer_id, key)
);
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);
