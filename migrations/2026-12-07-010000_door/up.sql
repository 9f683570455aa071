-- The door in front of sign-up and of each waiting room: a proof of work
-- (ALTCHA) whose size the admin sets per sale, each solution usable once,
-- and a limit per client address. All of it is decided in Postgres, in the
-- transaction that lets the visitor through.

-- How many tries a visitor's browser makes, on average, to solve the
-- puzzle for joining this sale's waiting room (see services::door).
ALTER TABLE products
    ADD COLUMN join_check_work INT NOT NULL DEFAULT 2000,
    ADD CONSTRAINT products_join_check_work_range
        CHECK (join_check_work BETWEEN 1 AND 1000000);

-- Solutions already used. A challenge carries its own expiry, so a row is
-- needed only until then; the jobs purge the rest.
CREATE TABLE spent_challenges (
    nonce TEXT PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX spent_challenges_expiry ON spent_challenges (expires_at);

-- Every visitor let through the door: the per-address limit counts these,
-- and the admin's door statistics read them. `door` is 'signup' or
-- 'join:{product}'.
CREATE TABLE door_passes (
    id BIGSERIAL PRIMARY KEY,
    door TEXT NOT NULL,
    client_ip TEXT NOT NULL,
    passed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX door_passes_by_address ON door_passes (door, client_ip, passed_at);

-- What never reaches a transaction that lets someone through: challenges
-- handed out and refusals by reason. Counted in each process and added
-- here by the jobs, so a crowd fetching challenges writes nothing per request.
CREATE TABLE door_counts (
    door TEXT NOT NULL,
    event TEXT NOT NULL,
    count BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (door, event)
);
