-- Courier's paused queues (`courier pause` / `courier resume`): a row per paused queue of a
-- message table. A template: `{paused}` is the table beside `{schedules}` (`courier_messages`
-- -> `courier_paused`), recorded in `{schedules}_migrations`. Times are epoch milliseconds.
CREATE TABLE IF NOT EXISTS {paused} (
    queue_name VARCHAR(190) NOT NULL PRIMARY KEY,
    paused_at INTEGER NOT NULL
);
