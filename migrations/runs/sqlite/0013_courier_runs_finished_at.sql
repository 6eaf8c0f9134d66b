-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs: the retention prunes the finished runs that finished longest ago, oldest first,
-- a batch at a time. Its statuses are a list, so the `(status, finished_at)` index of 0010 gives
-- each status its own order and the database reads every finished run to sort them; an index
-- on `finished_at` alone is read in that order and stops after the batch. It holds finished runs
-- only, so the writes of a run in flight (its claim, renewals and steps) never touch it.
CREATE INDEX {runs}_finished_at_idx ON {runs} (finished_at) WHERE finished_at IS NOT NULL;
