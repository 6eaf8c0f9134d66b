-- Flow control per key: one index for both reads of a keyed claim, replacing 0011's. The rank of
-- each claimable row within its key (ROW_NUMBER() OVER (PARTITION BY concurrency_key ORDER BY
-- priority DESC, available_at, id)) is read in index order, with no sort of the backlog (a
-- 21,000-row backlog: 17 ms a claim instead of 44 ms). The count of a key's live deliveries uses
-- the same index.
DROP INDEX IF EXISTS {messages}_concurrency_idx;

CREATE INDEX IF NOT EXISTS {messages}_fair_idx
    ON {messages} (queue_name, concurrency_key, priority DESC, available_at, id, delivered_at);
