-- A template: `{runs}` and `{events}` are the configured table names (applied once, recorded in
-- `{runs}_migrations`).
-- Durable runs in PostgreSQL's own types: run ids as UUID, inputs, outputs and step payloads as
-- JSONB (a value that is not JSON can no longer be stored). Existing rows are converted in place.
ALTER TABLE {runs}
    ALTER COLUMN id TYPE UUID USING id::uuid,
    ALTER COLUMN input TYPE JSONB USING input::jsonb,
    ALTER COLUMN output TYPE JSONB USING output::jsonb;
ALTER TABLE {events}
    ALTER COLUMN run_id TYPE UUID USING run_id::uuid,
    ALTER COLUMN payload TYPE JSONB USING payload::jsonb;
