-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable steps: the run's budget (its limits as JSON, its usage as counters added by each
-- step's guarded write), the signal a waiting run waits for, how many steps were replayed, and
-- the step journal `{runs}_steps`: one row per step index, written in the transaction that
-- renews the lease, and an index to prune finished runs by age. `status` is `intent` (a guarded step began, no result yet), `done` or `failed`.
ALTER TABLE {runs} ADD COLUMN budget TEXT NULL;
ALTER TABLE {runs} ADD COLUMN used_tokens_in BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {runs} ADD COLUMN used_tokens_out BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {runs} ADD COLUMN used_cost BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {runs} ADD COLUMN used_tool_calls BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {runs} ADD COLUMN used_turns BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {runs} ADD COLUMN steps_replayed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {runs} ADD COLUMN wait_signal TEXT NULL;
CREATE TABLE IF NOT EXISTS {runs}_steps (
    run_id TEXT NOT NULL,
    idx BIGINT NOT NULL,
    name TEXT NOT NULL,
    effect TEXT NOT NULL,
    status TEXT NOT NULL,
    output TEXT NULL,
    error TEXT NULL,
    error_class TEXT NULL,
    step_usage TEXT NULL,
    duration_ms BIGINT NOT NULL DEFAULT 0,
    attempts BIGINT NOT NULL DEFAULT 1,
    created_at BIGINT NOT NULL,
    finished_at BIGINT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE INDEX {runs}_finished_idx ON {runs} (status, finished_at);
