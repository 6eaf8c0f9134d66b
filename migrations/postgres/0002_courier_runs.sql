-- Durable runs (courier-runs): one row per run, one row per persisted step.
-- Times are epoch milliseconds from the database clock; lease_expires = 0 means no lease.
CREATE TABLE IF NOT EXISTS courier_runs (
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
CREATE INDEX IF NOT EXISTS courier_runs_status_lease_idx ON courier_runs (status, lease_expires);
CREATE TABLE IF NOT EXISTS courier_run_events (
    run_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    CONSTRAINT courier_run_events_run_seq_key UNIQUE (run_id, seq)
);
