-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable steps: the run's budget (its limits as JSON, its usage as counters added by each
-- step's guarded write), the signal a waiting run waits for, how many steps were replayed, and
-- the step journal `{runs}_steps`: one row per step index, written in the transaction that
-- renews the lease, and an index to prune finished runs by age. `status` is `intent` (a guarded step began, no result yet), `done` or `failed`.
-- One ALTER: MySQL DDL does not roll back.
ALTER TABLE {runs} ADD COLUMN budget LONGTEXT NULL,
    ADD COLUMN used_tokens_in BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN used_tokens_out BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN used_cost BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN used_tool_calls BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN used_turns BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN steps_replayed BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN wait_signal VARCHAR(191) NULL,
    ADD INDEX {runs}_finished_idx (status, finished_at);
CREATE TABLE IF NOT EXISTS {runs}_steps (
    run_id VARCHAR(36) NOT NULL,
    idx BIGINT NOT NULL,
    name VARCHAR(191) NOT NULL,
    effect VARCHAR(32) NOT NULL,
    status VARCHAR(16) NOT NULL,
    output LONGTEXT NULL,
    error LONGTEXT NULL,
    error_class VARCHAR(64) NULL,
    step_usage LONGTEXT NULL,
    duration_ms BIGINT NOT NULL DEFAULT 0,
    attempts BIGINT NOT NULL DEFAULT 1,
    created_at BIGINT NOT NULL,
    finished_at BIGINT NULL,
    PRIMARY KEY (run_id, idx)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
