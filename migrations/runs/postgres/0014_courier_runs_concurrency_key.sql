-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs: a run's concurrency key, stored with it so that every `RunAgent` dispatched for
-- it (its first, after a requeue, a wake-up or the reaper) carries it to the keyed runs transport,
-- which runs at most `concurrency_max` runs of one key at once. Nothing reads runs by it.
ALTER TABLE {runs} ADD COLUMN concurrency_key TEXT NULL;
