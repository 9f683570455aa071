-- The waiting room decided in Postgres alone (issue #37). Places, the
-- draw's two commitments, positions and passes live here and are decided
-- in the transactions that act on them; Redis and process memory only
-- cache what polls read.

-- The room: the seed's commitment (published when it opens), the frozen
-- pre-queue list's commitment (published at the start, before the seed is
-- revealed), the last position handed out (the drawn ones, then one per
-- late joiner) and whether an admin paused admission.
ALTER TABLE queue_draws
    ADD COLUMN frozen_at      TIMESTAMPTZ,
    ADD COLUMN entries_sha256 BYTEA CHECK (entries_sha256 IS NULL OR length(entries_sha256) = 32),
    ADD COLUMN last_position  INT NOT NULL DEFAULT 0 CHECK (last_position >= 0),
    ADD COLUMN admission_paused BOOLEAN NOT NULL DEFAULT false;
-- Draws of the Redis design were frozen as they were revealed.
UPDATE queue_draws SET frozen_at = drawn_at WHERE drawn_at IS NOT NULL;
ALTER TABLE queue_draws
    ADD CONSTRAINT queue_draws_frozen_then_drawn CHECK (drawn_at IS NULL OR frozen_at IS NOT NULL),
    ADD CONSTRAINT queue_draws_frozen_with_list CHECK ((frozen_at IS NULL) = (entries_sha256 IS NULL) OR drawn_at IS NOT NULL);
-- The latest pause or resume in the admin log is the room's state.
UPDATE queue_draws d SET admission_paused = coalesce((
    SELECT a.action = 'queue_pause' FROM admin_actions a
    WHERE a.product_id = d.product_id AND a.action IN ('queue_pause', 'queue_resume')
    ORDER BY a.id DESC LIMIT 1), false);

-- A place in the line: written for every pre-queue entry by the draw, and
-- at joining for a late one. Passes are issued in position order, and the
-- n-th pass (`queue_admissions.number`) goes to position n.
ALTER TABLE queue_entries ADD COLUMN position INT CHECK (position > 0);
ALTER TABLE queue_entries ADD CONSTRAINT queue_entries_one_per_position UNIQUE (product_id, position);

-- Arrival numbers come from one sequence now (no Redis INCR), above every
-- number handed out before.
CREATE SEQUENCE queue_entry_seq;
SELECT setval('queue_entry_seq', coalesce((SELECT max(seq) FROM queue_entries), 0) + 1, false);

-- A pass names its customer and covers min(limit, units still free).
ALTER TABLE queue_admissions
    ADD COLUMN customer_id BIGINT REFERENCES customers (id),
    ADD COLUMN units INT NOT NULL DEFAULT 1 CHECK (units > 0);
UPDATE queue_admissions a SET customer_id = e.customer_id
FROM queue_entries e WHERE e.product_id = a.product_id AND e.ticket = a.ticket;
ALTER TABLE queue_admissions ALTER COLUMN customer_id SET NOT NULL;
ALTER TABLE queue_admissions ALTER COLUMN units DROP DEFAULT;
CREATE UNIQUE INDEX queue_admissions_one_per_customer ON queue_admissions (product_id, customer_id);
-- Which sales have a live room, for the tick: open passes by deadline.
CREATE INDEX queue_admissions_deadlines ON queue_admissions (product_id, expires_at) WHERE state = 'issued';
