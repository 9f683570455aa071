-- Which pre-queue places the draw took, recorded with its reveal. A
-- pre-queue place that commits after the draw (its join was slow) is not
-- in the line; until now only Redis remembered to forget it, so a queue
-- rebuilt after Redis lost that note put it back into the drawn line and
-- shifted everyone behind it. Once `queue_draws.drawn_at` is set, the
-- drawn line is the rows with `drawn`, then the late ones.
ALTER TABLE queue_entries ADD COLUMN drawn BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE queue_entries ADD CONSTRAINT queue_entries_drawn_not_late
    CHECK (NOT (drawn AND late));
-- Draws revealed before this: every pre-queue row left is one it took
-- (those it went without were deleted).
UPDATE queue_entries e SET drawn = true
FROM queue_draws d
WHERE d.product_id = e.product_id AND d.drawn_at IS NOT NULL AND NOT e.late;
