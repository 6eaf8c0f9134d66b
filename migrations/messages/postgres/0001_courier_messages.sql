-- Courier's message table (SqlTransport). Times are epoch milliseconds from the database clock.
-- A template: `{messages}` is the configured table name (SqlTransport::setup renders and applies it
-- once, recorded in `{messages}_migrations`).
CREATE TABLE IF NOT EXISTS {messages} (
    id BIGSERIAL PRIMARY KEY,
    queue_name VARCHAR(190) NOT NULL,
    body TEXT NOT NULL,
    headers TEXT NOT NULL,
    priority SMALLINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    available_at BIGINT NOT NULL,
    delivered_at BIGINT NULL,
    delivery_id BIGINT NULL
);

-- Covers the claim query: WHERE queue_name = ? AND available_at <= now AND (delivered_at ...)
-- ORDER BY priority DESC, available_at, id.
CREATE INDEX IF NOT EXISTS {messages}_claim_idx
    ON {messages} (queue_name, priority DESC, available_at, id) INCLUDE (delivered_at);
