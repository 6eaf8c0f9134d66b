-- present-when: {messages}.concurrency_key (a table upgraded before versions were recorded: recorded, not run)
-- Flow control per key (`concurrency_max`, `fair`): each row's concurrency key (NULL: none). A
-- concurrency slot is a row of the key delivered under a live lease, counted by the claim
-- itself, so nothing else holds a slot. The partial index serves that count per key and costs
-- nothing to queues without keys.
ALTER TABLE {messages} ADD COLUMN IF NOT EXISTS concurrency_key VARCHAR(200) NULL;

CREATE INDEX IF NOT EXISTS {messages}_concurrency_idx
    ON {messages} (queue_name, concurrency_key, delivered_at) WHERE concurrency_key IS NOT NULL;
