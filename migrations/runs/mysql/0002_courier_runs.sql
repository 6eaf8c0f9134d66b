-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs (courier-runs): one row per run, one row per persisted step.
-- Times are epoch milliseconds from the database clock; lease_expires = 0 means no lease.
CREATE TABLE IF NOT EXISTS {runs} (
    id VARCHAR(36) NOT NULL PRIMARY KEY,
    agent VARCHAR(191) NOT NULL,
    status VARCHAR(32) NOT NULL,
    input LONGTEXT NOT NULL,
    output LONGTEXT NULL,
    error_class VARCHAR(32) NULL,
    termination_reason VARCHAR(32) NULL,
    claimed_by VARCHAR(255) NULL,
    lease_expires BIGINT NOT NULL DEFAULT 0,
    requeue_count BIGINT NOT NULL DEFAULT 0,
    pending_effect VARCHAR(255) NULL,
    created_at BIGINT NOT NULL,
    started_at BIGINT NULL,
    finished_at BIGINT NULL,
    updated_at BIGINT NOT NULL,
    INDEX {runs}_status_lease_idx (status, lease_expires)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS {events} (
    run_id VARCHAR(36) NOT NULL,
    seq BIGINT NOT NULL,
    kind VARCHAR(191) NOT NULL,
    payload LONGTEXT NOT NULL,
    created_at BIGINT NOT NULL,
    CONSTRAINT {events}_run_seq_key UNIQUE (run_id, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
