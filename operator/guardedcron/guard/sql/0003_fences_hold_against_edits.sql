-- guardedcron schema, version 3: the guarantee holds against hand-edited tables, reused
-- holder ids, odd inputs and other isolation levels.
--
-- * Fences come from one database-wide sequence. Deleting or truncating rows of any
--   table cannot make a fence be handed out twice: a sequence is not rolled back, not
--   reset by DELETE or TRUNCATE, and refuses (NO CYCLE) instead of wrapping past the
--   bigint maximum. Per lock, fences still only grow; they are no longer consecutive.
-- * `leases.slot` remembers the slot of the holder's run, so a holder id asking again
--   for another slot is not mistaken for a retry of the same call.
-- * release_v2 takes the fence: a stale process reusing a holder id cannot end a newer
--   generation's lease.
-- * check_fence refuses NULL, zero and negative fences, a placeholder row, and a fence
--   older than a run the lock has already started (a restored older lease row).
-- * The _v1 functions stay for guards already deployed; acquire_v1 and renew_v1 now run
--   the v2 code, so old guards get the same protection.

CREATE SEQUENCE guardedcron.fences AS bigint MINVALUE 1 NO CYCLE;
COMMENT ON SEQUENCE guardedcron.fences IS
    'Every fencing token is drawn here: unique across locks, never reused, never wraps.';

-- Start after every fence already handed out by schema version 1 or 2.
SELECT CASE WHEN high = 0 THEN setval('guardedcron.fences', 1, false)
            ELSE setval('guardedcron.fences', high, true) END
  FROM (SELECT greatest(
            (SELECT coalesce(max(fence), 0) FROM guardedcron.leases),
            (SELECT coalesce(max(fence), 0) FROM guardedcron.runs),
            (SELECT coalesce(max(fence), 0) FROM guardedcron.slot_claims)) AS high) AS issued;

ALTER TABLE guardedcron.leases ADD COLUMN slot bigint;
UPDATE guardedcron.leases l SET slot = r.slot FROM guardedcron.runs r WHERE r.id = l.run_id;
-- Set by release: a generation that ended is never renewed again (a renewal still in
-- flight when the keeper released would otherwise extend it), nor answered 'already-held'.
ALTER TABLE guardedcron.leases ADD COLUMN released_at timestamptz;

-- check_fence asks "has this lock started a run with a newer fence?"
CREATE INDEX runs_lock_fence ON guardedcron.runs (lock_name, fence) WHERE fence IS NOT NULL;

-- Refuse what the callers (CLI, library, CRD) already refuse, in case another client
-- calls the functions directly: SQLSTATE 22023 (invalid_parameter_value).
CREATE FUNCTION guardedcron._check_lease_seconds(p_what text, p_seconds double precision)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_seconds IS NULL OR p_seconds <> p_seconds OR p_seconds < 0.1 OR p_seconds > 604800 THEN
        RAISE EXCEPTION 'guardedcron: % must be between 0.1 and 604800 seconds (7 days), got %',
                        p_what, p_seconds
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- The next fence for a lock whose current fence is p_current: from the sequence, and
-- above p_current even if the sequence was set back by hand. SQLSTATE GC002 when the
-- bigint range is used up, instead of an overflow or a wrap.
CREATE FUNCTION guardedcron._next_fence(p_lock text, p_current bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    drawn bigint;
BEGIN
    BEGIN
        drawn := nextval('guardedcron.fences');
        IF drawn <= coalesce(p_current, 0) THEN
            drawn := p_current + 1;
            PERFORM setval('guardedcron.fences', drawn, true);
        END IF;
    EXCEPTION WHEN sequence_generator_limit_exceeded OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'guardedcron: no fencing token is left for lock "%": fences reached the bigint maximum',
                        p_lock
            USING ERRCODE = 'GC002',
                  HINT = 'Fences never wrap; an administrator must move the jobs to a new lock name.';
    END;
    RETURN drawn;
END
$$;

-- Take the lease for p_lock if it is free (and p_slot not yet claimed), in one call.
-- As acquire_v1, with fences from the sequence, 'already-held' only for the same slot,
-- and a clear serialization failure (40001) where another isolation level hides a row.
CREATE FUNCTION guardedcron.acquire_v2(
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
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur   guardedcron.leases%ROWTYPE;
    claim guardedcron.slot_claims%ROWTYPE;
    t     timestamptz := clock_timestamp();
    lease interval;
    new_fence bigint;
    new_run bigint;
    skip_run bigint;
BEGIN
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
        INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until, min_hold_until)
        VALUES (p_lock, '', 0, t, t, t)
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

    new_fence := guardedcron._next_fence(p_lock, cur.fence);
    -- A run still marked running whose lease ran out was abandoned by its holder.
    UPDATE guardedcron.runs r
       SET outcome = 'abandoned', finished_at = cur.locked_until,
           reason = format('lease ran out at %s; taken over by %s with fence %s',
                           cur.locked_until, p_holder, new_fence)
     WHERE r.id = cur.run_id AND r.outcome = 'running';

    INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, outcome)
    VALUES (p_lock, p_slot, p_holder, new_fence, t, 'running')
    RETURNING id INTO new_run;

    UPDATE guardedcron.leases l
       SET holder = p_holder, fence = new_fence, acquired_at = t,
           locked_until = t + lease,
           min_hold_until = t + make_interval(secs => p_min_hold_seconds),
           run_id = new_run, slot = p_slot, released_at = NULL
     WHERE l.lock_name = p_lock;

    IF p_slot IS NOT NULL THEN
        INSERT INTO guardedcron.slot_claims (lock_name, slot, holder, fence, claimed_at)
        VALUES (p_lock, p_slot, p_holder, new_fence, t);
    END IF;

    -- Retention, bounded by age and by count, paid by the winner of each run.
    DELETE FROM guardedcron.runs r
     WHERE r.lock_name = p_lock AND r.started_at < t - make_interval(days => p_retain_days);
    DELETE FROM guardedcron.runs r
     WHERE r.lock_name = p_lock
       AND r.id <= (SELECT r2.id FROM guardedcron.runs r2 WHERE r2.lock_name = p_lock
                     ORDER BY r2.id DESC OFFSET p_retain_runs LIMIT 1);
    DELETE FROM guardedcron.slot_claims c
     WHERE c.lock_name = p_lock
       AND c.claimed_at < t - make_interval(days => greatest(p_retain_days, 1));

    RETURN QUERY SELECT true, 'acquired'::text, p_holder, new_fence, t + lease, new_run, t;
END
$$;

-- Extend a lease; only the holder with the current (positive) fence may, and not after
-- it released the lease: an ended generation stays ended. (A lease that ran out but was
-- not taken over can still be renewed by its holder: no one holds a newer fence.)
-- Never shortens.
CREATE FUNCTION guardedcron.renew_v2(
    p_lock text, p_holder text, p_fence bigint, p_lease_seconds double precision
) RETURNS TABLE (renewed boolean, holder text, fence bigint, locked_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t   timestamptz := clock_timestamp();
BEGIN
    PERFORM guardedcron._check_lease_seconds('the lease', p_lease_seconds);
    UPDATE guardedcron.leases l
       SET locked_until = greatest(l.locked_until, t + make_interval(secs => p_lease_seconds))
     WHERE l.lock_name = p_lock AND l.holder = p_holder AND l.fence = p_fence
       AND p_fence > 0 AND p_holder <> '' AND l.released_at IS NULL
    RETURNING l.* INTO cur;
    IF FOUND THEN
        RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, t;
        RETURN;
    END IF;
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, t;
END
$$;

-- End a lease early (not before its minimum hold) and record the run's outcome; only the
-- holder with the current fence may, so a stale process reusing the holder id cannot.
CREATE FUNCTION guardedcron.release_v2(
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
     WHERE r.id = cur.run_id AND r.outcome = 'running';
    RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
END
$$;

-- Guards already deployed call the _v1 names: give them the v2 behaviour. release_v1
-- stays holder-only (it has no fence to check) but ends the generation the same way.
CREATE OR REPLACE FUNCTION guardedcron.acquire_v1(
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
LANGUAGE sql AS $$
    SELECT * FROM guardedcron.acquire_v2(p_lock, p_holder, p_lease_seconds, p_min_hold_seconds,
                                         p_slot, p_retain_days, p_retain_runs)
$$;

CREATE OR REPLACE FUNCTION guardedcron.release_v1(
    p_lock text, p_holder text, p_outcome text, p_reason text
) RETURNS TABLE (released boolean, holder text, fence bigint, locked_until timestamptz,
                 run_id bigint, db_now timestamptz)
LANGUAGE sql AS $$
    SELECT * FROM guardedcron.release_v2(
        p_lock, p_holder,
        (SELECT l.fence FROM guardedcron.leases l WHERE l.lock_name = p_lock AND l.holder = p_holder),
        p_outcome, p_reason)
$$;

CREATE OR REPLACE FUNCTION guardedcron.renew_v1(
    p_lock text, p_holder text, p_fence bigint, p_lease_seconds double precision
) RETURNS TABLE (renewed boolean, holder text, fence bigint, locked_until timestamptz, db_now timestamptz)
LANGUAGE sql AS $$
    SELECT * FROM guardedcron.renew_v2(p_lock, p_holder, p_fence, p_lease_seconds)
$$;

-- For the workload: call inside the transaction that makes a guarded write.
-- Raises SQLSTATE GC001 unless p_fence is the lock's current fence: a positive fence, held
-- by a real holder (not the placeholder a refused first attempt leaves), and no run of the
-- lock started with a newer one (a restored older lease row does not bring a stale
-- generation back). Keeps a KEY SHARE lock on the lease row until the caller's transaction
-- ends, so a takeover (FOR UPDATE) cannot slip in between this check and the commit;
-- renewals by the holder (non-key UPDATEs) are not blocked.
CREATE OR REPLACE FUNCTION guardedcron.check_fence(p_lock text, p_fence bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cur_fence  bigint;
    cur_holder text;
BEGIN
    IF p_fence IS NULL OR p_fence <= 0 THEN
        RAISE EXCEPTION 'guardedcron: fencing token % for lock "%" is not a positive integer',
                        coalesce(p_fence::text, 'NULL'), p_lock
            USING ERRCODE = 'GC001',
                  HINT = 'Pass the fence the guard wrote to /var/run/guardedcron/fence.';
    END IF;
    SELECT l.fence, l.holder INTO cur_fence, cur_holder
      FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR KEY SHARE;
    IF NOT FOUND OR cur_holder = '' THEN
        RAISE EXCEPTION 'guardedcron: no lease named "%" is held', p_lock
            USING ERRCODE = 'GC001';
    END IF;
    IF cur_fence <> p_fence OR EXISTS (
        SELECT 1 FROM guardedcron.runs r
         WHERE r.lock_name = p_lock AND r.fence > p_fence AND r.fence IS NOT NULL
    ) THEN
        RAISE EXCEPTION 'guardedcron: stale fencing token % for lock "%": fence % is now held by %',
                        p_fence, p_lock, cur_fence, cur_holder
            USING ERRCODE = 'GC001',
                  HINT = 'Another run took over after this run''s lease ran out; stop and exit.';
    END IF;
    RETURN cur_fence;
END
$$;
