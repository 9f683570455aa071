-- The Redis stock gate's admission key for this order, so every restore path
-- can hand the admitted units back to the gate exactly once.
ALTER TABLE orders ADD COLUMN gate_key TEXT CHECK (gate_key IS NULL OR length(gate_key) BETWEEN 1 AND 64);
