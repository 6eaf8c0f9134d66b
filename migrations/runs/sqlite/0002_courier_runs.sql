-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs (courier-runs): one row per run, one row per persisted step.
-- Times are epoch milliseconds from the database clock; lease_expires = 0 means no lease.
CREATE TABLE IF NOT EXISTS {runs} (
    id TEXT PRIMARY KEY NOT NULL,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    input TEXT NOT NULL,
    output TEXT NULL,
    error_class TEXT NULL,
    termination_reason TEXT NULL,
    claimed_by TEXT NULL,
    lease_expires BIGINT NOT NULL DEFAULT 0,
    requeue_count BIGINT NOT NULL DEFAULT 0,
    pending_effect TEXT NULL,
    created_at BIGINT NOT NULL,
    started_at BIGINT NULL,
    finished_at BIGINT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS {runs}_status_lease_idx ON {runs} (status, lease_expires);
CREATE TABLE IF NOT EXISTS {events} (
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    CONSTRAINT {events}_run_seq_key UNIQUE (run_id, seq)
);
