-- Flow control per key: one index for both reads of a keyed claim, replacing 0011's. The rank of
-- each claimable row within its key (ROW_NUMBER() OVER (PARTITION BY concurrency_key ORDER BY
-- priority DESC, available_at, id)) is read in index order, and the count of a key's live
-- deliveries uses the same index.
ALTER TABLE {messages}
    DROP KEY courier_concurrency_idx,
    ADD KEY courier_fair_idx (queue_name, concurrency_key, priority DESC, available_at, id, delivered_at);
