-- Courier's message table (SqlTransport). Times are epoch milliseconds from the database clock.
-- A template: `{messages}` is the configured table name (SqlTransport::setup renders and applies it
-- once, recorded in `{messages}_migrations`).
-- MySQL 8 / MariaDB 10.6+ (SKIP LOCKED). The index is declared inline: MySQL has no
-- CREATE INDEX IF NOT EXISTS, and index names are per table. Queue names compare exactly
-- (binary collation); body and headers use a non-binary collation so drivers read them as text.
CREATE TABLE IF NOT EXISTS {messages} (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue_name VARCHAR(190) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    body LONGTEXT NOT NULL,
    headers LONGTEXT NOT NULL,
    priority SMALLINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    available_at BIGINT NOT NULL,
    delivered_at BIGINT NULL,
    delivery_id BIGINT NULL,
    -- Covers the claim query: WHERE queue_name = ? AND available_at <= now AND (delivered_at ...)
    -- ORDER BY priority DESC, available_at, id.
    KEY courier_claim_idx (queue_name, priority DESC, available_at, id, delivered_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci;
