-- Expired deduplication keys are pruned: the transport deletes them in bounded passes (at most
-- 1,000 rows each, oldest first), which this index finds without reading the live keys; a take
-- still finds its key by the primary key. `{dedup}` is the message table's name with `_dedup`
-- appended.
CREATE INDEX IF NOT EXISTS {dedup}_exp_idx ON {dedup} (expires_at);
