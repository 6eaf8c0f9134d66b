-- Courier's worker registry (`courier workers`, `courier stop-workers`): one row per running
-- worker. A template: `{workers}` is the registry table of a message table (`courier_messages`
-- -> `courier_workers`), recorded in `{workers}_migrations`. Times are epoch milliseconds from
-- the database clock.
CREATE TABLE IF NOT EXISTS {workers} (
    id TEXT NOT NULL PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    version TEXT NOT NULL,
    transports TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    last_heartbeat INTEGER NOT NULL,
    handled INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    stop_requested INTEGER NOT NULL DEFAULT 0
);
