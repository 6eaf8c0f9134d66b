-- The inbox of an idempotent consumer (courier_sql::Inbox): one row per message id a consumer
-- handled, recorded in the handler's own database (inside its transaction when it claims there).
-- `{inbox}` is the configured table name. `handled_at` is epoch milliseconds from the database
-- clock; rows older than the retention are deleted by the inbox's cleanup.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer VARCHAR(190) NOT NULL,
    message_id VARCHAR(64) NOT NULL,
    handled_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {inbox}_handled_at_idx ON {inbox} (handled_at);
