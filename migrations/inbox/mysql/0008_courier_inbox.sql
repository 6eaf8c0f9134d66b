-- The inbox of an idempotent consumer (courier_sql::Inbox): one row per message id a consumer
-- handled, recorded in the handler's own database (inside its transaction when it claims there).
-- `{inbox}` is the configured table name. `handled_at` is epoch milliseconds from the database
-- clock; rows older than the retention are deleted by the inbox's cleanup. Ids compare exactly.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer VARCHAR(190) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    handled_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id),
    INDEX {inbox}_handled_at_idx (handled_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
