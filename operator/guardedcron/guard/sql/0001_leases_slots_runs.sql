-- guardedcron schema, version 1: leases with fencing tokens, slot claims, run history.
--
-- Every time comparison uses clock_timestamp(), the database clock at the moment
-- the statement runs. now() would be the start of the surrounding transaction,
-- which is how a lease taken inside a long transaction ends up "expired" at birth.

CREATE TABLE guardedcron.leases (
    lock_name      text        PRIMARY KEY,
    holder         text        NOT NULL,
    fence          bigint      NOT NULL,
    acquired_at    timestamptz NOT NULL,
    locked_until   timestamptz NOT NULL,
    min_hold_until timestamptz NOT NULL,
    run_id         bigint
);
COMMENT ON TABLE guardedcron.leases IS
    'One row per lock, never deleted: the fence counter lives here and must only grow.';

CREATE TABLE guardedcron.slot_claims (
    lock_name  text        NOT NULL,
    slot       bigint      NOT NULL,
    holder     text        NOT NULL,
    fence      bigint      NOT NULL,
    claimed_at timestamptz NOT NULL,
    PRIMARY KEY (lock_name, slot)
);
CREATE INDEX slot_claims_lock_claimed_at ON guardedcron.slot_claims (lock_name, claimed_at);
COMMENT ON TABLE guardedcron.slot_claims IS
    'At most one run per (lock, scheduled minute), however many clusters fire it.';

CREATE TABLE guardedcron.runs (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lock_name   text        NOT NULL,
    slot        bigint,
    holder      text        NOT NULL,
    fence       bigint,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    outcome     text        NOT NULL CHECK (outcome IN (
                    'running', 'succeeded', 'failed', 'finished',
                    'skipped', 'abandoned', 'lost')),
    reason      text        NOT NULL DEFAULT ''
);
CREATE INDEX runs_lock_started_at ON guardedcron.runs (lock_name, started_at);
CREATE INDEX runs_lock_id ON guardedcron.runs (lock_name, id);
CREATE INDEX runs_running ON guardedcron.runs (lock_name) WHERE outcome = 'running';
COMMENT ON TABLE guardedcron.runs IS
    'One row per attempt, winners and skipped ones; bounded by age and count on every acquisition.';

-- Record an attempt that did not get the lease.
CREATE FUNCTION guardedcron._record_skip(
    p_lock text, p_holder text, p_slot bigint, p_reason text, p_at timestamptz
) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO guardedcron.runs (lock_name, slot, holder, started_at, finished_at, outcome, reason)
    VALUES (p_lock, p_slot, p_holder, p_at, p_at, 'skipped', p_reason)
    RETURNING id
$$;

-- Take the lease for p_lock if it is free (and p_slot not yet claimed), in one call.
-- Never waits on a held lease: a live lease is seen without a row lock and answered at once.
CREATE FUNCTION guardedcron.acquire_v1(
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
    lease interval := make_interval(secs => p_lease_seconds);
    new_fence bigint;
    new_run bigint;
    skip_run bigint;
BEGIN
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    IF FOUND AND cur.locked_until > t AND cur.holder <> p_holder THEN
        skip_run := guardedcron._record_skip(p_lock, p_holder, p_slot,
            format('lease held by %s (fence %s) until %s', cur.holder, cur.fence, cur.locked_until), t);
        RETURN QUERY SELECT false, 'lease-held'::text, cur.holder, cur.fence, cur.locked_until, skip_run, t;
        RETURN;
    END IF;
    IF NOT FOUND THEN
        INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until, min_hold_until)
        VALUES (p_lock, '', 0, t, t, t)
        ON CONFLICT (lock_name) DO NOTHING;
    END IF;

    -- Serialise with other acquirers and with fenced writes (check_fence holds KEY SHARE).
    PERFORM set_config('lock_timeout', '5s', true);
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR UPDATE;
    t := clock_timestamp();

    IF cur.locked_until > t THEN
        IF cur.holder = p_holder THEN
            -- The same holder asking again (a retried call): answer with its lease.
            RETURN QUERY SELECT true, 'already-held'::text, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
            RETURN;
        END IF;
        skip_run := guardedcron._record_skip(p_lock, p_holder, p_slot,
            format('lease held by %s (fence %s) until %s', cur.holder, cur.fence, cur.locked_until), t);
        RETURN QUERY SELECT false, 'lease-held'::text, cur.holder, cur.fence, cur.locked_until, skip_run, t;
        RETURN;
    END IF;

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

    new_fence := cur.fence + 1;
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
           run_id = new_run
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

-- Extend a lease; only the holder with the current fence may.
CREATE FUNCTION guardedcron.renew_v1(
    p_lock text, p_holder text, p_fence bigint, p_lease_seconds double precision
) RETURNS TABLE (renewed boolean, holder text, fence bigint, locked_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t   timestamptz := clock_timestamp();
BEGIN
    UPDATE guardedcron.leases l
       SET locked_until = greatest(l.locked_until, t + make_interval(secs => p_lease_seconds))
     WHERE l.lock_name = p_lock AND l.holder = p_holder AND l.fence = p_fence
    RETURNING l.* INTO cur;
    IF FOUND THEN
        RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, t;
        RETURN;
    END IF;
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, t;
END
$$;

-- End a lease early (but not before its minimum hold) and record the run's outcome.
CREATE FUNCTION guardedcron.release_v1(
    p_lock text, p_holder text, p_outcome text, p_reason text
) RETURNS TABLE (released boolean, holder text, fence bigint, locked_until timestamptz,
                 run_id bigint, db_now timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t   timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR UPDATE;
    IF NOT FOUND OR cur.holder <> p_holder THEN
        RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
        RETURN;
    END IF;
    t := clock_timestamp();
    UPDATE guardedcron.leases l
       SET locked_until = greatest(l.min_hold_until, least(l.locked_until, t))
     WHERE l.lock_name = p_lock
    RETURNING l.* INTO cur;
    UPDATE guardedcron.runs r
       SET outcome = p_outcome, finished_at = t, reason = p_reason
     WHERE r.id = cur.run_id AND r.outcome = 'running';
    RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
END
$$;

-- Record that a holder lost its lease while running (seen by the keeper).
CREATE FUNCTION guardedcron.mark_lost_v1(
    p_lock text, p_holder text, p_fence bigint, p_reason text
) RETURNS bigint
LANGUAGE sql AS $$
    UPDATE guardedcron.runs r
       SET outcome = 'lost', finished_at = coalesce(r.finished_at, clock_timestamp()), reason = p_reason
     WHERE r.lock_name = p_lock AND r.holder = p_holder AND r.fence = p_fence
       AND r.outcome IN ('running', 'abandoned')
    RETURNING r.id
$$;

-- Mark runs still 'running' whose lease ran out (or was taken over) as abandoned.
CREATE FUNCTION guardedcron.mark_abandoned_v1(p_lock text) RETURNS integer
LANGUAGE sql AS $$
    WITH stale AS (
        UPDATE guardedcron.runs r
           SET outcome = 'abandoned',
               finished_at = CASE WHEN l.run_id = r.id THEN l.locked_until ELSE l.acquired_at END,
               reason = CASE WHEN l.run_id = r.id
                             THEN format('lease ran out at %s with no release', l.locked_until)
                             ELSE format('lease taken over by %s with fence %s', l.holder, l.fence) END
          FROM guardedcron.leases l
         WHERE r.lock_name = p_lock AND l.lock_name = p_lock AND r.outcome = 'running'
           AND (l.run_id IS DISTINCT FROM r.id OR l.locked_until <= clock_timestamp())
        RETURNING r.id
    )
    SELECT count(*)::integer FROM stale
$$;

-- For the workload: call inside the transaction that makes a guarded write.
-- Raises SQLSTATE GC001 when p_fence is no longer the lock's current fence. It keeps a
-- KEY SHARE lock on the lease row until the caller's transaction ends, so a takeover
-- (which needs FOR UPDATE) cannot slip in between this check and the caller's commit;
-- renewals by the holder (plain UPDATEs) are not blocked.
CREATE FUNCTION guardedcron.check_fence(p_lock text, p_fence bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cur_fence  bigint;
    cur_holder text;
BEGIN
    SELECT l.fence, l.holder INTO cur_fence, cur_holder
      FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'guardedcron: no lease named "%" exists', p_lock
            USING ERRCODE = 'GC001';
    END IF;
    IF cur_fence <> p_fence THEN
        RAISE EXCEPTION 'guardedcron: stale fencing token % for lock "%": fence % is now held by %',
                        p_fence, p_lock, cur_fence, cur_holder
            USING ERRCODE = 'GC001',
                  HINT = 'Another run took over after this run''s lease ran out; stop and exit.';
    END IF;
    RETURN cur_fence;
END
$$;
