-- Courier's message table (SqlTransport). Times are epoch milliseconds from the database clock.
-- SqlTransport::setup runs this file with `courier_messages` replaced by the configured table name.
-- AUTOINCREMENT: ids are never reused, so an id names one message for good.
CREATE TABLE IF NOT EXISTS courier_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue_name TEXT NOT NULL,
    body TEXT NOT NULL,
    headers TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    delivered_at INTEGER NULL,
    delivery_id INTEGER NULL
);

-- Covers the claim query: WHERE queue_name = ? AND available_at <= now AND (delivered_at ...)
-- ORDER BY priority DESC, available_at, id.
CREATE INDEX IF NOT EXISTS courier_messages_claim_idx
    ON courier_messages (queue_name, priority DESC, available_at, id, delivered_at);
