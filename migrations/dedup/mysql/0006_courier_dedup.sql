-- Deduplication keys of DeduplicateStamp, beside the message table: `{dedup}` is the message
-- table's name with `_dedup` appended. A key is taken until `expires_at` (epoch milliseconds from
-- the database clock). Keys compare exactly (binary collation).
CREATE TABLE IF NOT EXISTS {dedup} (
    dedup_key VARCHAR(190) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    expires_at BIGINT NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
