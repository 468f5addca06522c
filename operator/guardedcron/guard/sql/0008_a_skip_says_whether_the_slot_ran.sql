-- guardedcron schema, version 8: one meaning of a skip (issue 36).
--
-- A losing acquire_v2 answers 'slot-claimed' when the slot it asks for was already run
-- (its claim exists), and 'lease-held' only when it was not. Until this version the
-- unlocked first read answered 'lease-held' for any live lease of another holder, also
-- when that holder was running this very slot in another cluster, so the operator could
-- not tell "ran elsewhere" (settled) from "turned away by a run of another slot or by a
-- dead holder" (missed: reported, and made up by catch-up). The claim lookup is one
-- probe of slot_claims' primary key, on losses only. Nothing else changes.

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
    new_generation bigint;
    new_run bigint;
    -- A losing attempt's answer, recorded once at the end.
    lost_reason text;
    lost_why text;
    lost_holder text;
    lost_fence bigint;
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

        -- The next fence: from the sequence, and above the row's even if the sequence was set
        -- back by hand; GC002 when the bigint range is used up, instead of an overflow or a
        -- wrap. (This block's subtransaction was measured: a few microseconds, no write.)
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
                   generation = new_generation
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
