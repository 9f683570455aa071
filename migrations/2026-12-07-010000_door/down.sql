DROP TABLE door_counts;
DROP TABLE door_passes;
DROP TABLE spent_challenges;
ALTER TABLE products DROP COLUMN join_check_work;
