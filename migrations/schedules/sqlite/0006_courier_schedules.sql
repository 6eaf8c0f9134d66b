-- Courier's recurring schedules: one row per schedule with its lease (the worker firing it and
-- until when) and its last fired tick. A template: `{schedules}` is the schedule table of a
-- message table (`courier_messages` -> `courier_schedules`), recorded in
-- `{schedules}_migrations`. Times are epoch milliseconds (the lease from the database clock).
CREATE TABLE IF NOT EXISTS {schedules} (
    name VARCHAR(190) NOT NULL PRIMARY KEY,
    owner VARCHAR(255) NOT NULL,
    lease_until INTEGER NOT NULL,
    last_tick INTEGER NULL
);
