-- Deduplication keys of DeduplicateStamp, beside the message table: `{dedup}` is the message
-- table's name with `_dedup` appended. A key is taken until `expires_at` (epoch milliseconds from
-- the database clock); an expired row is replaced by the next taker in the same statement.
CREATE TABLE IF NOT EXISTS {dedup} (
    dedup_key VARCHAR(190) NOT NULL PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
