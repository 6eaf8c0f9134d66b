-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs: the listing (`courier runs list`, the dashboard) pages newest first with a
-- keyset cursor (created_at, id), unfiltered, by status or by agent: one index for each, so a
-- page deep in the list is a seek and `limit` rows, not a scan.
CREATE INDEX {runs}_created_idx ON {runs} (created_at, id);
CREATE INDEX {runs}_status_created_idx ON {runs} (status, created_at, id);
CREATE INDEX {runs}_agent_created_idx ON {runs} (agent, created_at, id);
