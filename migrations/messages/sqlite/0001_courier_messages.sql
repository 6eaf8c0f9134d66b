-- Courier's message table (SqlTransport). Times are epoch milliseconds from the database clock.
-- A template: `{messages}` is the configured table name (SqlTransport::setup renders and applies it
-- once, recorded in `{messages}_migrations`).
-- AUTOINCREMENT: ids are never reused, so an id names one message for good.
CREATE TABLE IF NOT EXISTS {messages} (
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
CREATE INDEX IF NOT EXISTS {messages}_claim_idx
    ON {messages} (queue_name, priority DESC, available_at, id, delivered_at);
