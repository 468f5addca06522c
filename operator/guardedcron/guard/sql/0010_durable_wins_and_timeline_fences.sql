-- guardedcron schema, version 10: a win is as durable as the server can make it, whatever
-- the session asks for, and no fence is handed out twice across a failover.
--
-- * A session may run with synchronous_commit = off (ALTER DATABASE or ALTER ROLE ... SET,
--   or PGOPTIONS), or local / remote_write. A win committed that way was acknowledged
--   before its WAL reached the disk (or the synchronous standbys): a crash of the server
--   then took it back, its slot ran again and its fence was drawn again. A winning
--   acquire_v2 and a successful renewal now set synchronous_commit = on for their own
--   transaction (set_config(..., true), as _record_skip sets it off for a loss: it lasts
--   until the commit); a stronger setting (remote_apply) is kept. Losses, releases and
--   fence checks are unchanged: losing them decides nothing.
-- * A failover to a standby that had not received the last commits (asynchronous
--   replication) takes those wins back, and with them the sequence's advance: the
--   promoted server would draw the same fences again. Fences now carry the server's
--   timeline, which every promotion (and every point-in-time recovery) raises: a win on
--   timeline n draws at least (n - 1) * 2^40, above every fence of an earlier timeline
--   while that timeline handed out fewer than 2^40 (docs/design.md, "Guarantees").
--   A server that was never promoted (timeline 1) draws exactly as before.

-- As version 9's, with the fence's band and the durable commit of a win.
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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp
    SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
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
    band_floor bigint;
    new_generation bigint;
    new_run bigint;
    -- A losing attempt's answer, recorded once at the end.
    lost_reason text;
    lost_why text;
    lost_holder text;
    lost_fence bigint;
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._admit_write(p_holder, NULL);
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

    <<decide>>
    BEGIN
        SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
        IF FOUND AND cur.locked_until > t AND cur.holder <> p_holder THEN
            -- A live lease held by another: answered without a row lock, and as the locked
            -- path answers it: a claimed slot first, so 'lease-held' always means the slot
            -- did not run (its holder is a run of another slot, a manual run, or a dead pod
            -- whose lease has not run out), and 'slot-claimed' that it did.
            IF p_slot IS NOT NULL THEN
                SELECT * INTO claim FROM guardedcron.slot_claims c
                 WHERE c.lock_name = p_lock AND c.slot = p_slot;
                IF FOUND THEN
                    lost_reason := 'slot-claimed';
                    lost_why := format('slot %s already run by %s (fence %s) at %s',
                                       p_slot, claim.holder, claim.fence, claim.claimed_at);
                    lost_holder := claim.holder;
                    lost_fence := claim.fence;
                    EXIT decide;
                END IF;
            END IF;
            lost_reason := 'lease-held';
            EXIT decide;
        END IF;
        IF NOT FOUND THEN
            -- A placeholder that no fence check accepts (fence 0, no holder, already expired).
            -- A lease row deleted by hand comes back counting on from the lock's kept history.
            INSERT INTO guardedcron.leases (lock_name, holder, fence, acquired_at, locked_until, min_hold_until,
                                            generation, retain_days, reclaim_after)
            VALUES (p_lock, '', 0, t, t, t,
                    coalesce((SELECT max(r.generation) FROM guardedcron.runs r WHERE r.lock_name = p_lock), 0),
                    p_retain_days, t + make_interval(days => p_retain_days))
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
                lost_reason := 'slot-claimed';
                lost_why := format('slot %s already run by %s (fence %s) at %s',
                                   p_slot, claim.holder, claim.fence, claim.claimed_at);
                lost_holder := claim.holder;
                lost_fence := claim.fence;
                EXIT decide;
            END IF;
        END IF;

        IF cur.locked_until > t THEN
            -- Held by someone else, or by this holder id for another run (a reused id must not
            -- turn a second slot into a retry of the first).
            lost_reason := 'lease-held';
            EXIT decide;
        END IF;

        -- The next fence: from the sequence; above the row's even if the sequence was set
        -- back by hand; and at least the band of this server's timeline, so that a fence
        -- drawn after a promotion is above every fence the old primary handed out, also
        -- those a failover lost; GC002 when the bigint range is used up, instead of an
        -- overflow or a wrap. (This block's subtransaction was measured: a few
        -- microseconds, no write.)
        BEGIN
            new_fence := nextval('guardedcron.fences');
            -- The timeline is the WAL file name's first 8 hex digits; timeline n's band
            -- starts at (n - 1) * 2^40 (timeline 1, a server never promoted: 0).
            band_floor := (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1)
                          * 1099511627776;
            IF new_fence <= cur.fence OR new_fence < band_floor THEN
                new_fence := greatest(cur.fence + 1, band_floor);
                PERFORM setval('guardedcron.fences', new_fence, true);
            END IF;
        EXCEPTION WHEN sequence_generator_limit_exceeded OR numeric_value_out_of_range THEN
            RAISE EXCEPTION 'guardedcron: no fencing token is left for lock "%": fences reached the bigint maximum',
                            p_lock
                USING ERRCODE = 'GC002',
                      HINT = 'Fences never wrap; an administrator must move the jobs to a new lock name.';
        END;
        new_generation := cur.generation + 1;
        -- A win commits durably whatever the session asked for (the database's, the role's
        -- or PGOPTIONS' synchronous_commit): until the end of this transaction, at least
        -- a local flush and, where synchronous_standby_names names standbys, their flush.
        IF current_setting('synchronous_commit') IN ('off', 'local', 'remote_write') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;

        -- The win, in one statement: a run still marked running whose lease ran out was
        -- abandoned by its holder (looked up by id and lock name, see version 5); the new
        -- run; the lease row pointing at it; the slot's claim.
        WITH abandoned AS (
            UPDATE guardedcron.runs r
               SET outcome = 'abandoned', finished_at = cur.locked_until,
                   reason = format('lease ran out at %s; taken over by %s with fence %s',
                                   cur.locked_until, p_holder, new_fence)
             WHERE r.id = cur.run_id AND r.lock_name = p_lock AND r.outcome = 'running'
        ), won AS (
            INSERT INTO guardedcron.runs (lock_name, slot, holder, fence, started_at, outcome, generation)
            VALUES (p_lock, p_slot, p_holder, new_fence, t, 'running', new_generation)
            RETURNING id
        ), leased AS (
            UPDATE guardedcron.leases l
               SET holder = p_holder, fence = new_fence, acquired_at = t,
                   locked_until = t + lease,
                   min_hold_until = t + make_interval(secs => p_min_hold_seconds),
                   run_id = (SELECT won.id FROM won), slot = p_slot, released_at = NULL,
                   generation = new_generation, retain_days = p_retain_days
             WHERE l.lock_name = p_lock
        ), claimed AS (
            INSERT INTO guardedcron.slot_claims (lock_name, slot, holder, fence, claimed_at)
            SELECT p_lock, p_slot, p_holder, new_fence, t WHERE p_slot IS NOT NULL
        )
        SELECT won.id INTO new_run FROM won;

        -- Retention, paid by the winner, at most retention_batch rows of each table (as in
        -- version 5, "Retention" in docs/design.md). Past the count cap: every run inserted
        -- before the oldest winning run of the last p_retain_runs generations (the run just
        -- inserted qualifies, so there always is one: a separate statement sees it); then
        -- runs older than p_retain_days; and claims older than that.
        WITH keep AS (
            SELECT r.id FROM guardedcron.runs r
             WHERE r.lock_name = p_lock AND r.generation > new_generation - p_retain_runs
             ORDER BY r.generation LIMIT 1
        ), doomed AS (
            (SELECT r.ctid FROM guardedcron.runs r
              WHERE r.lock_name = p_lock AND r.id < (SELECT keep.id FROM keep)
              ORDER BY r.id LIMIT retention_batch)
            UNION ALL
            (SELECT r.ctid FROM guardedcron.runs r
              WHERE r.lock_name = p_lock AND r.started_at < t - make_interval(days => p_retain_days)
                AND r.id >= (SELECT keep.id FROM keep)
              ORDER BY r.started_at, r.id LIMIT retention_batch)
            LIMIT retention_batch
        ), runs_gone AS (
            DELETE FROM guardedcron.runs r WHERE r.ctid = ANY (ARRAY(SELECT doomed.ctid FROM doomed))
        )
        DELETE FROM guardedcron.slot_claims c
         WHERE c.ctid = ANY (ARRAY(
               SELECT o.ctid FROM guardedcron.slot_claims o
                WHERE o.lock_name = p_lock AND o.claimed_at < t - make_interval(days => p_retain_days)
                ORDER BY o.claimed_at LIMIT retention_batch));
        -- And a batch of a lock nobody uses any more (see the top).
        PERFORM guardedcron._reclaim_a_dead_lock(p_lock, t, retention_batch);

        RETURN QUERY SELECT true, 'acquired'::text, p_holder, new_fence, t + lease, new_run, t;
        RETURN;
    END decide;

    -- Every loss: its history row, and the answer.
    IF lost_reason = 'lease-held' THEN
        lost_why := format('lease held by %s (fence %s) until %s', cur.holder, cur.fence, cur.locked_until);
        lost_holder := cur.holder;
        lost_fence := cur.fence;
    END IF;
    RETURN QUERY SELECT false, lost_reason, lost_holder, lost_fence, cur.locked_until,
                        guardedcron._record_skip(p_lock, p_holder, p_slot, lost_why, t), t;
END
$$;

-- As version 3's body, behind version 4's checking renew_v2; a renewal that extends the
-- lease commits durably, for the same reason as a win: a renewal lost by a crash would
-- give the lease to another holder while this one still counts on it.
CREATE OR REPLACE FUNCTION guardedcron._renew_v2(
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
        IF current_setting('synchronous_commit') IN ('off', 'local', 'remote_write') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, t;
        RETURN;
    END IF;
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock;
    RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, t;
END
$$;
