-- Courier's message table (SqlTransport). Times are epoch milliseconds from the database clock.
-- SqlTransport::setup runs this file with `courier_messages` replaced by the configured table name.
CREATE TABLE IF NOT EXISTS courier_messages (
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
CREATE INDEX IF NOT EXISTS courier_messages_claim_idx
    ON courier_messages (queue_name, priority DESC, available_at, id) INCLUDE (delivered_at);
