-- guardedcron schema, version 2: indexes for the history queries of a long history.
-- (Measured with a year of a one-minute job, 535,000 runs of one lock: docs/benchmarks.md.)

-- Gap checks look runs up by slot. Without this index their OR of "slot in range" and
-- "manual run in the window" can use no index, and a week's check reads the whole table.
CREATE INDEX runs_lock_slot ON guardedcron.runs (lock_name, slot);

-- Runs in (started_at, id) order, as the overlap check walks them. With the tie-breaker
-- in the index, "the latest earlier run" stops at its first match; with (lock_name,
-- started_at) alone, an incremental sort read every older run to close its first group.
-- It also serves everything the old index served, which it replaces.
CREATE INDEX runs_lock_started_at_id ON guardedcron.runs (lock_name, started_at, id);
DROP INDEX guardedcron.runs_lock_started_at;
