-- present-when: {messages}.concurrency_key (a table upgraded before versions were recorded: recorded, not run)
-- Flow control per key (`concurrency_max`, `fair`): each row's concurrency key (NULL: none). A
-- concurrency slot is a row of the key delivered under a live lease, counted by the claim
-- itself, so nothing else holds a slot. The index serves that count per key. Keys compare
-- exactly (binary collation), at most 200 bytes.
ALTER TABLE {messages}
    ADD COLUMN concurrency_key VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD KEY courier_concurrency_idx (queue_name, concurrency_key, delivered_at);
