-- Cursor outboxes (`cursor=true`, PostgreSQL): a queue that a relay reads by a cursor instead of
-- claiming or draining each row. Its rows carry the id of the transaction that wrote them
-- (`relay_tx`, from pg_current_xact_id()), so a reader can take them in a fixed order once every
-- transaction that could still add a row before them has ended; `{messages}_cursors` holds each
-- such queue's cursor (the last row relayed) and the relay that took it last (the relay holds it
-- by a lock of its session, which ends with the relay's process). Rows of other
-- queues keep `relay_tx` NULL and stay out of the partial index (their inserts do not pay for it).
ALTER TABLE {messages} ADD COLUMN IF NOT EXISTS relay_tx BIGINT NULL;

CREATE INDEX IF NOT EXISTS {messages}_cursor_idx
    ON {messages} (queue_name, relay_tx, id) WHERE relay_tx IS NOT NULL;

CREATE TABLE IF NOT EXISTS {messages}_cursors (
    queue_name VARCHAR(190) PRIMARY KEY,
    tx BIGINT NOT NULL,
    id BIGINT NOT NULL,
    owner VARCHAR(190) NOT NULL,
    moved_at BIGINT NOT NULL
);
