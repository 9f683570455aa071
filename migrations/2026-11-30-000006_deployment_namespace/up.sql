-- One row per database: the namespace of every Redis key this database's shop
-- writes. A fresh (or reset) database gets a fresh namespace, so keys left in
-- Redis by an earlier database, or by another deployment sharing the Redis,
-- are never mistaken for this one's locks, fences or gate counts.
CREATE TABLE deployment (
    singleton       BOOLEAN     PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    redis_namespace TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO deployment (redis_namespace)
VALUES (substr(replace(gen_random_uuid()::text, '-', ''), 1, 16));
