-- Durable runs: when a queued run becomes due (epoch ms from the database clock), so the reaper
-- can re-dispatch a run queued far past it whose message was lost. Rows queued before this
-- migration count as due when they were last written.
ALTER TABLE courier_runs ADD COLUMN due_at BIGINT NOT NULL DEFAULT 0;
UPDATE courier_runs SET due_at = updated_at;
CREATE INDEX courier_runs_status_due_idx ON courier_runs (status, due_at);
