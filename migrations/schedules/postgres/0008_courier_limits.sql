-- Courier's rate-limit buckets (`rate_limit` on a transport): a row per queue of a message
-- table. A template: `{limits}` is the table beside `{schedules}` (`courier_messages` ->
-- `courier_limits`), recorded in `{schedules}_migrations`. `tat` is the bucket's theoretical
-- arrival time in epoch microseconds of the database clock; `granted` what the last take got.
CREATE TABLE IF NOT EXISTS {limits} (
    queue_name VARCHAR(190) NOT NULL PRIMARY KEY,
    tat BIGINT NOT NULL,
    granted BIGINT NOT NULL
);
