-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs: a uniqueness key held until `unique_until` (epoch ms from the database clock).
-- The unique index lets one run hold a key at a time (NULLs, runs without a key, never clash);
-- an expired key is cleared before the next run takes it.
ALTER TABLE {runs} ADD COLUMN unique_key TEXT NULL;
ALTER TABLE {runs} ADD COLUMN unique_until BIGINT NULL;
CREATE UNIQUE INDEX {runs}_unique_key_idx ON {runs} (unique_key);
