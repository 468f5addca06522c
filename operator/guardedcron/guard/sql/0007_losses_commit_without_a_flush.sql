-- guardedcron schema, version 7: a losing attempt's record commits without waiting for
-- its WAL flush (issue 13).
--
-- Every loss is recorded (a `skipped` run with its reason). Before this version that row
-- made each losing call a durable commit: it waited for the WAL to reach the disk, like a
-- win, while the insert-then-update pattern's losing UPDATE writes nothing and waits for
-- nothing. With 16 callers on one lock 15 of 16 answers are losses, and their flushes
-- were most of the time those calls took.
--
-- _record_skip (the loss exit of acquire_v2, and record_skip_v1) now sets
-- synchronous_commit = off for its own transaction (set_config(..., true); none of the
-- callers has a SET clause for it, so it lasts until the commit). Such a commit is
-- written to the WAL at once and flushed by the WAL writer within three times
-- wal_writer_delay (600 ms by default), or sooner by any later durable commit, since the
-- WAL is one sequence. What a crash of the server can take is only the skip records of
-- that last moment; a win never commits this way: its fence (drawn from a sequence whose
-- WAL a lost commit would take back), its lease row and its slot claim wait for the flush
-- as before, and nothing of a loss changes what any later call decides.

CREATE OR REPLACE FUNCTION guardedcron._record_skip(
    p_lock text, p_holder text, p_slot bigint, p_reason text, p_at timestamptz
) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, guardedcron, pg_temp AS $$
DECLARE
    skip_run bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO guardedcron.runs (lock_name, slot, holder, started_at, finished_at, outcome, reason)
    VALUES (p_lock, p_slot, p_holder, p_at, p_at, 'skipped', p_reason)
    RETURNING id INTO skip_run;
    RETURN skip_run;
END
$$;
