-- present-when: {runs}.due_at (a table upgraded before versions were recorded: recorded, not run)
-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs: when a queued run becomes due (epoch ms from the database clock), so the reaper
-- can re-dispatch a run queued far past it whose message was lost. Rows queued before this
-- migration count as due when they were last written.
ALTER TABLE {runs} ADD COLUMN due_at BIGINT NOT NULL DEFAULT 0;
UPDATE {runs} SET due_at = updated_at;
CREATE INDEX {runs}_status_due_idx ON {runs} (status, due_at);
