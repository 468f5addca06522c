-- guardedcron schema, version 5: retention off the critical path (issue 13).
--
-- Up to version 4 every winning acquisition found its count cut-off with
-- `ORDER BY id DESC OFFSET retain_runs LIMIT 1`, a walk of the lock's whole history
-- (2.2 of 2.3 ms at the 10,000-run cap), and deleted however much lay past it.
-- From version 5:
--
-- * retain_runs counts lease generations: winning runs. Each win is numbered per lock
--   (`leases.generation`, `runs.generation`, consecutive, taken under the lease row's
--   lock), so the oldest winning run to keep, the first of the last retain_runs
--   generations, is one index probe at any history length. Skipped attempts go with the
--   generation they lost to: every run that started before the oldest kept winning run
--   is past the cap. (Up to version 4 skips counted toward retain_runs, so a second
--   cluster halved the days a lock's history covered.)
-- * A winning acquisition deletes at most RETENTION_BATCH (16) rows of `runs`, oldest
--   first, past the cap or older than retain_days, and at most 16 slot claims older than
--   retain_days. A backlog (a history from before version 5, a lowered retain_runs, a
--   generation that collected more than 15 skipped attempts) drains by that much per win,
--   on the wins that follow, instead of in one long call.
-- * Losing attempts delete nothing, as before: they never wait on, or lock, anything.
--
-- And the search path is pinned once per call instead of five times. Each function with
-- its own `SET search_path` makes PostgreSQL 15 switch the path on entry and back on exit
-- (and look the schemas up again); an acquisition went through five (acquire_v2,
-- _require_grant, _acquire_v2, _check_lease_seconds, _next_fence). Now:
-- * acquire_v2 holds the body itself (_acquire_v2 and _next_fence, used by it alone, go);
-- * the helpers lose their own pin: they are the owner's alone (nobody else may call
--   them) and run only inside the entry points, whose pinned path they inherit.
-- The run a win or a release updates is looked up by id and lock name: by id and
-- `outcome = 'running'` alone, a plan made while few runs were running could read every
-- running run of every lock, on each call.

ALTER TABLE guardedcron.leases ADD COLUMN generation bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN guardedcron.leases.generation IS
    'How many times the lock was won: the generation of its newest winning run.';
ALTER TABLE guardedcron.runs ADD COLUMN generation bigint;
COMMENT ON COLUMN guardedcron.runs.generation IS
    'A winning run''s number among its lock''s wins (null for skipped attempts); retention keeps the newest retain_runs.';

-- Number the winning runs already there, per lock in the order they were inserted.
WITH numbered AS (
    SELECT r.id, row_number() OVER (PARTITION BY r.lock_name ORDER BY r.id) AS generation
      FROM guardedcron.runs r
     WHERE r.fence IS NOT NULL
)
UPDATE guardedcron.runs r SET generation = n.generation FROM numbered n WHERE r.id = n.id;
UPDATE guardedcron.leases l SET generation = newest.generation
  FROM (SELECT r.lock_name, max(r.generation) AS generation
          FROM guardedcron.runs r WHERE r.generation IS NOT NULL GROUP BY r.lock_name) newest
 WHERE newest.lock_name = l.lock_name;

-- "The oldest winning run of the last N generations" is the first entry past a bound.
CREATE INDEX runs_lock_generation ON guardedcron.runs (lock_name, generation)
    WHERE generation IS NOT NULL;

-- Version 4's wrapper and version 3's body in one function, with the win numbered and
-- retention bounded. (CREATE OR REPLACE keeps its owner and its grants.)
CREATE OR REPLACE FUNCTION guardedcron.acquire_v2(
    p_lock text,
    p_holder text,
    p_lease_seconds double precision,
    p_min_hold_seconds double precision,
    p_slot bigint,
    p_retain_days integer,
    p_retain_runs integer
) RETURNS TABLE (
    acquired boolean, reason text, holder text, fence bigint,
    locked_until timestamptz, run_id bigint, db_now timestamptz
)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
#variable_conflict use_column
DECLARE
    -- Rows of runs, and of slot_claims, one winning call deletes at most
    -- (guardedcron.guard.lease.RETENTION_BATCH says the same).
    retention_batch CONSTANT integer := 16;
    cur   guardedcron.leases%ROWTYPE;
    claim guardedcron.slot_claims%ROWTYPE;
    t     timestamptz := clock_timestamp();
    lease interval;
    new_fence bigint;
    new_generation bigint;
    new_run bigint;
    skip_run bigint;
    keep_from bigint;
    doomed bigint[];
    old_claims tid[];
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._check_lease_seconds('the lease', p_lease_seconds);
    IF p_min_hold_seconds IS NULL OR p_min_hold_seconds < 0 OR p_min_hold_seconds > p_lease_seconds THEN
        RAISE EXCEPTION 'guardedcron: the minimum hold must be between 0 and the lease (% s), got %',
                        p_lease_seconds, p_min_hold_seconds
            USING ERRCODE = '22023';
    END IF;
    IF p_slot < 0 OR p_retain_days < 1 OR p_retain_runs < 1 THEN
        RAISE EXCEPTION 'guardedcron: slot must not be negative and retention must be at least 1'
            USING ERRCODE = '22023';
    END IF;
    lease := make_interval(secs => p_lease_seconds);

    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    IF FOUND AND cur.locked_until > t AND cur.holder <> p_holder THEN
        skip_run := guardedcron._record_skip(p_lock, p_holder, p_slot,
            format('lease held by %s (fence %s) until %s', cur.holder, cur.fence, cur.locked_until), t);
        RETURN QUERY SELECT false, 'lease-held'::text, cur.holder, cur.fence, cur.locked_until, skip_run, t;
        RETURN;
    END IF;
    IF NOT FOUND THEN
        -- A placeholder that no fence check accepts (fence 0, no holder, already expired).
        -- A lease row deleted by hand comes back counting on from the lock's kept history.
        INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until, min_hold_until,
                                        generation)
        VALUES (p_lock, '', 0, t, t, t,
                coalesce((SELECT max(r.generation) FROM guardedcron.runs r WHERE r.lock_name = p_lock), 0))
        ON CONFLICT (lock_name) DO NOTHING;
    END IF;

    -- Serialise with other acquirers and with fenced writes (check_fence holds KEY SHARE).
    PERFORM set_config('lock_timeout', '5s', true);
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR UPDATE;
    IF NOT FOUND THEN
        -- Only a snapshot older than a concurrent insert (REPEATABLE READ, SERIALIZABLE)
        -- gets here: the caller retries in a new transaction.
        RAISE EXCEPTION 'guardedcron: the lease row of "%" is not visible to this transaction''s snapshot', p_lock
            USING ERRCODE = '40001';
    END IF;
    t := clock_timestamp();

    IF cur.locked_until > t AND cur.holder = p_holder AND cur.slot IS NOT DISTINCT FROM p_slot
       AND cur.released_at IS NULL THEN
        -- The same holder asking again for the same run (a retried call).
        RETURN QUERY SELECT true, 'already-held'::text, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
        RETURN;
    END IF;

    -- A slot runs once, whoever holds the lease now.
    IF p_slot IS NOT NULL THEN
        SELECT * INTO claim FROM guardedcron.slot_claims c
         WHERE c.lock_name = p_lock AND c.slot = p_slot;
        IF FOUND THEN
            skip_run := guardedcron._record_skip(p_lock, p_holder, p_slot,
                format('slot %s already run by %s (fence %s) at %s', p_slot, claim.holder, claim.fence, claim.claimed_at), t);
            RETURN QUERY SELECT false, 'slot-claimed'::text, claim.holder, claim.fence, cur.locked_until, skip_run, t;
            RETURN;
        END IF;
    END IF;

    IF cur.locked_until > t THEN
        -- Held by someone else, or by this holder id for another run (a reused id must not
        -- turn a second slot into a retry of the first).
        skip_run := guardedcron._record_skip(p_lock, p_holder, p_slot,
            format('lease held by %s (fence %s) until %s', cur.holder, cur.fence, cur.locked_until), t);
        RETURN QUERY SELECT false, 'lease-held'::text, cur.holder, cur.fence, cur.locked_until, skip_run, t;
        RETURN;
    END IF;

    -- The next fence: from the sequence, and above the row's even if the sequence was set
    -- back by hand; GC002 when the bigint range is used up, instead of an overflow or a wrap.
    BEGIN
        new_fence := nextval('guardedcron.fences');
        IF new_fence <= cur.fence THEN
            new_fence := cur.fence + 1;
            PERFORM setval('guardedcron.fences', new_fence, true);
        END IF;
    EXCEPTION WHEN sequence_generator_limit_exceeded OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'guardedcron: no fencing token is left for lock "%": fences reached the bigint maximum',
                        p_lock
            USING ERRCODE = 'GC002',
                  HINT = 'Fences never wrap; an administrator must move the jobs to a new lock name.';
    END;
    new_generation := cur.generation + 1;
    -- A run still marked running whose lease ran out was abandoned by its holder. (The lock
    -- name keeps the plan to this lock's rows: by `id = ... AND outcome = 'running'` alone,
    -- a plan made when few runs were running read every running run of every lock, 37
    -- buffers a call at 300 and growing with a fleet's storm.)
    UPDATE guardedcron.runs r
       SET outcome = 'abandoned', finished_at = cur.locked_until,
           reason = format('lease ran out at %s; taken over by %s with fence %s',
                           cur.locked_until, p_holder, new_fence)
     WHERE r.id = cur.run_id AND r.lock_name = p_lock AND r.outcome = 'running';

    INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, outcome, generation)
    VALUES (p_lock, p_slot, p_holder, new_fence, t, 'running', new_generation)
    RETURNING id INTO new_run;

    UPDATE guardedcron.leases l
       SET holder = p_holder, fence = new_fence, acquired_at = t,
           locked_until = t + lease,
           min_hold_until = t + make_interval(secs => p_min_hold_seconds),
           run_id = new_run, slot = p_slot, released_at = NULL, generation = new_generation
     WHERE l.lock_name = p_lock;

    IF p_slot IS NOT NULL THEN
        INSERT INTO guardedcron.slot_claims (lock_name, slot, holder, fence, claimed_at)
        VALUES (p_lock, p_slot, p_holder, new_fence, t);
    END IF;

    -- Retention, paid by the winner, a bounded batch a call. Past the cap: every run that
    -- started before the oldest winning run of the last p_retain_runs generations (found
    -- from above the bound, so the walk does not grow with the history; the run just
    -- inserted qualifies, so there always is one). Rows are picked first and deleted only
    -- when there are any: most wins delete one generation's rows, many none.
    SELECT r.id INTO keep_from FROM guardedcron.runs r
     WHERE r.lock_name = p_lock AND r.generation > new_generation - p_retain_runs
     ORDER BY r.generation LIMIT 1;
    doomed := ARRAY(SELECT r.id FROM guardedcron.runs r
                     WHERE r.lock_name = p_lock AND r.id < keep_from
                     ORDER BY r.id LIMIT retention_batch);
    IF cardinality(doomed) < retention_batch THEN
        doomed := doomed || ARRAY(
            SELECT r.id FROM guardedcron.runs r
             WHERE r.lock_name = p_lock AND r.started_at < t - make_interval(days => p_retain_days)
               AND r.id >= keep_from
             ORDER BY r.started_at, r.id LIMIT retention_batch - cardinality(doomed));
    END IF;
    IF cardinality(doomed) > 0 THEN
        DELETE FROM guardedcron.runs r WHERE r.id = ANY (doomed);
    END IF;
    old_claims := ARRAY(SELECT c.ctid FROM guardedcron.slot_claims c
                         WHERE c.lock_name = p_lock AND c.claimed_at < t - make_interval(days => p_retain_days)
                         ORDER BY c.claimed_at LIMIT retention_batch);
    IF cardinality(old_claims) > 0 THEN
        DELETE FROM guardedcron.slot_claims c WHERE c.ctid = ANY (old_claims);
    END IF;

    RETURN QUERY SELECT true, 'acquired'::text, p_holder, new_fence, t + lease, new_run, t;
END
$$;

-- A losing attempt's history row. In PL/pgSQL rather than SQL: PostgreSQL 15 plans an SQL
-- function it cannot inline again on every call (this one runs on every loss).
CREATE OR REPLACE FUNCTION guardedcron._record_skip(
    p_lock text, p_holder text, p_slot bigint, p_reason text, p_at timestamptz
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    skip_run bigint;
BEGIN
    INSERT INTO guardedcron.runs (lock_name, slot, holder, started_at, finished_at, outcome, reason)
    VALUES (p_lock, p_slot, p_holder, p_at, p_at, 'skipped', p_reason)
    RETURNING id INTO skip_run;
    RETURN skip_run;
END
$$;

-- As version 3's release body, with the lock name in the run's UPDATE for the same reason
-- as acquire_v2's (a release of each run of a fleet read every running run).
CREATE OR REPLACE FUNCTION guardedcron._release_v2(
    p_lock text, p_holder text, p_fence bigint, p_outcome text, p_reason text
) RETURNS TABLE (released boolean, holder text, fence bigint, locked_until timestamptz,
                 run_id bigint, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t   timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR UPDATE;
    IF NOT FOUND OR cur.holder <> p_holder OR cur.fence IS DISTINCT FROM p_fence OR p_fence <= 0 THEN
        RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
        RETURN;
    END IF;
    t := clock_timestamp();
    UPDATE guardedcron.leases l
       SET locked_until = greatest(l.min_hold_until, least(l.locked_until, t)),
           released_at = coalesce(l.released_at, t)
     WHERE l.lock_name = p_lock
    RETURNING l.* INTO cur;
    UPDATE guardedcron.runs r
       SET outcome = p_outcome, finished_at = t, reason = p_reason
     WHERE r.id = cur.run_id AND r.lock_name = p_lock AND r.outcome = 'running';
    RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
END
$$;

DROP FUNCTION guardedcron._acquire_v2(text, text, double precision, double precision, bigint, integer, integer);
DROP FUNCTION guardedcron._next_fence(text, bigint);

-- Helpers run with the path of the entry point that calls them (see the top).
ALTER FUNCTION guardedcron._require_grant(text) RESET search_path;
ALTER FUNCTION guardedcron._check_lease_seconds(text, double precision) RESET search_path;
ALTER FUNCTION guardedcron._renew_v2(text, text, bigint, double precision) RESET search_path;
