-- Courier's worker registry (`courier workers`, `courier stop-workers`): one row per running
-- worker. A template: `{workers}` is the registry table of a message table (`courier_messages`
-- -> `courier_workers`), recorded in `{workers}_migrations`. Times are epoch milliseconds from
-- the database clock.
CREATE TABLE IF NOT EXISTS {workers} (
    id VARCHAR(190) NOT NULL PRIMARY KEY,
    host VARCHAR(255) NOT NULL,
    pid BIGINT NOT NULL,
    version VARCHAR(64) NOT NULL,
    transports TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    last_heartbeat BIGINT NOT NULL,
    handled BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    stop_requested BIGINT NOT NULL DEFAULT 0
);
