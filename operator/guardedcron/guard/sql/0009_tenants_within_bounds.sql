-- guardedcron schema, version 9: tenants get their own locks and no more, and cannot
-- write without bound.
--
-- * The caller is found by identity, never by parsing its name. Up to version 8 the
--   grant check cast session_user's text to regrole, which folds an unquoted name to
--   lower case and reads an all-digit name as an OID: a role named "Payments", or one
--   named after the decimal OID of payments, had payments' grants, and roles whose names
--   are not plain lower-case identifiers ("Reports", "team.b", "team b") got an error
--   instead of theirs. Now: the pg_roles row whose name equals session_user exactly.
-- * Every text argument of an entry point is bounded: lock and holder names at most 253
--   characters (the CLI's NAME_MAX), reasons at most 4,096 (the termination message's
--   size): SQLSTATE GC004 past that, before anything is read or written, and the message
--   does not echo the text.
-- * At most 4 calls that write (acquire, renew, release, record_skip, mark_lost,
--   mark_abandoned) in one transaction: SQLSTATE GC005 for the 5th, which rolls back
--   everything the statement did. The guard makes one per transaction; a query that
--   calls an entry point per row of a set (200,000 history rows in one statement) is
--   refused. The count costs nothing for the first call of a transaction: only a call
--   that finds its transaction already holding a transaction id (it wrote before) counts
--   itself, in `write_calls`, a table of the owner's only (a setting would be the
--   caller's to reset).
-- * A lock nobody uses any more is reclaimed. Retention (version 5) trims a lock's
--   history when that lock is won again; a lock never won again kept its lease row, its
--   runs and its slot claims for ever. `leases.retain_days` remembers the retention its
--   last winner asked for; when its lease ran out more than that many days ago, each win
--   of any other lock deletes up to 16 of its runs and 16 of its claims, and its lease
--   row once nothing else of it is left. `leases.reclaim_after` is when to look at a
--   lock again (indexed; bumped, not kept exact, so that a win's update of its lease row
--   stays HOT). A lock acquired again later starts afresh with a new fence from the
--   sequence; a stale holder's check_fence finds no lease and fails (GC001). Rows from
--   before this version count 90 days (the guard's default).

-- Lengths and the count of writing calls, for the entry points (the grant check bounds
-- the lock name). The owner's only; runs inside the entry points' pinned path.
CREATE UNLOGGED TABLE guardedcron.write_calls (
    backend integer PRIMARY KEY,  -- pg_backend_pid()
    xact    xid8    NOT NULL,     -- the transaction counted
    calls   integer NOT NULL
);
COMMENT ON TABLE guardedcron.write_calls IS
    'Writing calls of a transaction past its first, per backend (crash-reset: it only counts).';

CREATE FUNCTION guardedcron._admit_write(p_holder text, p_reason text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    name_max CONSTANT integer := 253;
    reason_max CONSTANT integer := 4096;
    calls_max CONSTANT integer := 4;
    counted integer;
BEGIN
    IF char_length(p_holder) > name_max THEN
        RAISE EXCEPTION 'guardedcron: the holder name is % characters long; at most %',
                        char_length(p_holder), name_max
            USING ERRCODE = 'GC004';
    END IF;
    IF char_length(p_reason) > reason_max THEN
        RAISE EXCEPTION 'guardedcron: the reason is % characters long; at most %',
                        char_length(p_reason), reason_max
            USING ERRCODE = 'GC004';
    END IF;
    -- No transaction id yet: nothing was written in this transaction, so this is its first
    -- writing call (the guard's only one). Nothing to count, nothing written.
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO guardedcron.write_calls AS w (backend, xact, calls)
    VALUES (pg_backend_pid(), pg_current_xact_id(), 2)
    ON CONFLICT (backend) DO UPDATE
       SET calls = CASE WHEN w.xact = excluded.xact THEN w.calls + 1 ELSE 2 END,
           xact = excluded.xact
    RETURNING w.calls INTO counted;
    IF counted > calls_max THEN
        RAISE EXCEPTION 'guardedcron: at most % calls that write may run in one transaction', calls_max
            USING ERRCODE = 'GC005',
                  HINT = 'Call the guardedcron functions once per transaction, as the guard does, not once per row of a query.';
    END IF;
END
$$;

-- As version 4's, with the caller found by identity, and the lock name bounded first (a
-- refusal names the lock: never a name of any length).
CREATE OR REPLACE FUNCTION guardedcron._require_grant(p_lock text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF char_length(p_lock) > 253 THEN
        RAISE EXCEPTION 'guardedcron: the lock name is % characters long; at most 253', char_length(p_lock)
            USING ERRCODE = 'GC004';
    END IF;
    IF p_lock IS NOT NULL AND (
        pg_has_role(session_user,
                    (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'guardedcron'), 'USAGE')
        OR EXISTS (SELECT 1 FROM guardedcron.lock_grants g
                    WHERE g.role = (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user)
                      AND starts_with(p_lock, g.prefix))
        OR EXISTS (SELECT 1 FROM guardedcron.lock_grants g
                    WHERE starts_with(p_lock, g.prefix)
                      AND pg_has_role(session_user, g.role, 'USAGE'))) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'guardedcron: lock "%" is not granted to role "%"', p_lock, session_user
        USING ERRCODE = 'GC003',
              HINT = format('An administrator grants it with: guardedcron db grant --role %s --lock-prefix PREFIX',
                            quote_ident(session_user));
END
$$;

ALTER TABLE guardedcron.leases
    ADD COLUMN retain_days integer NOT NULL DEFAULT 90,
    ADD COLUMN reclaim_after timestamptz NOT NULL DEFAULT '-infinity';
COMMENT ON COLUMN guardedcron.leases.retain_days IS
    'The retention in days the lock''s last winner asked for: the lock is reclaimed that long after its lease ran out.';
COMMENT ON COLUMN guardedcron.leases.reclaim_after IS
    'Not before this is the lock looked at for reclaiming (a lower bound, moved on when the lock is found in use).';
COMMENT ON TABLE guardedcron.leases IS
    'One row per lock in use; a lock unused for its retention goes. Fences come from the fences sequence, never from here.';
UPDATE guardedcron.leases l SET reclaim_after = l.locked_until + make_interval(days => l.retain_days);
CREATE INDEX leases_reclaim_after ON guardedcron.leases (reclaim_after);

-- One step of reclaiming the lock unused longest, if its time has come (not p_lock: the
-- caller holds it). SKIP LOCKED: a lock someone is acquiring or checking a fence of is
-- in use, and never waited for.
CREATE FUNCTION guardedcron._reclaim_a_dead_lock(p_lock text, p_at timestamptz, p_batch integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    dead guardedcron.leases%ROWTYPE;
BEGIN
    SELECT * INTO dead FROM guardedcron.leases l
     WHERE l.reclaim_after < p_at AND l.lock_name <> p_lock
     ORDER BY l.reclaim_after LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF dead.locked_until + make_interval(days => dead.retain_days) >= p_at THEN
        -- Used since: look again once its retention after its current lease has passed.
        UPDATE guardedcron.leases l
           SET reclaim_after = dead.locked_until + make_interval(days => dead.retain_days)
         WHERE l.lock_name = dead.lock_name;
        RETURN;
    END IF;
    DELETE FROM guardedcron.runs r WHERE r.ctid = ANY (ARRAY(
        SELECT o.ctid FROM guardedcron.runs o WHERE o.lock_name = dead.lock_name ORDER BY o.id LIMIT p_batch));
    DELETE FROM guardedcron.slot_claims c WHERE c.ctid = ANY (ARRAY(
        SELECT o.ctid FROM guardedcron.slot_claims o WHERE o.lock_name = dead.lock_name
         ORDER BY o.claimed_at LIMIT p_batch));
    IF NOT EXISTS (SELECT 1 FROM guardedcron.runs r WHERE r.lock_name = dead.lock_name)
       AND NOT EXISTS (SELECT 1 FROM guardedcron.slot_claims c WHERE c.lock_name = dead.lock_name) THEN
        DELETE FROM guardedcron.leases l WHERE l.lock_name = dead.lock_name;
    END IF;
END
$$;

-- As version 8's, with the holder bounded, the call counted, the retention remembered
-- and a dead lock reclaimed on each win.
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

-- The other writing entry points: as before, with their text bounded and the call counted.
CREATE OR REPLACE FUNCTION guardedcron.renew_v2(
    p_lock text, p_holder text, p_fence bigint, p_lease_seconds double precision
) RETURNS TABLE (renewed boolean, holder text, fence bigint, locked_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._admit_write(p_holder, NULL);
    RETURN QUERY SELECT * FROM guardedcron._renew_v2(p_lock, p_holder, p_fence, p_lease_seconds);
END
$$;

CREATE OR REPLACE FUNCTION guardedcron.record_skip_v1(
    p_lock text, p_holder text, p_slot bigint, p_reason text
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._admit_write(p_holder, p_reason);
    RETURN guardedcron._record_skip(p_lock, p_holder, p_slot, p_reason, clock_timestamp());
END
$$;

CREATE OR REPLACE FUNCTION guardedcron.mark_lost_v1(
    p_lock text, p_holder text, p_fence bigint, p_reason text
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
DECLARE
    marked bigint;
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._admit_write(p_holder, p_reason);
    WITH lost AS (
        UPDATE guardedcron.runs r
           SET outcome = 'lost', finished_at = coalesce(r.finished_at, clock_timestamp()), reason = p_reason
         WHERE r.lock_name = p_lock AND r.holder = p_holder AND r.fence = p_fence
           AND r.outcome IN ('running', 'abandoned')
        RETURNING r.id
    )
    SELECT min(lost.id) INTO marked FROM lost;
    RETURN marked;
END
$$;

CREATE OR REPLACE FUNCTION guardedcron.mark_abandoned_v1(p_lock text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
DECLARE
    marked integer;
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._admit_write(NULL, NULL);
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
    SELECT count(*)::integer INTO marked FROM stale;
    RETURN marked;
END
$$;

CREATE OR REPLACE FUNCTION guardedcron.release_v2(
    p_lock text, p_holder text, p_fence bigint, p_outcome text, p_reason text
) RETURNS TABLE (released boolean, holder text, fence bigint, locked_until timestamptz,
                 run_id bigint, db_now timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp
    SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    cur guardedcron.leases%ROWTYPE;
    t   timestamptz := clock_timestamp();
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    PERFORM guardedcron._admit_write(p_holder, p_reason);
    SELECT * INTO cur FROM guardedcron.leases l WHERE l.lock_name = p_lock FOR UPDATE;
    IF NOT FOUND OR cur.holder <> p_holder OR cur.fence IS DISTINCT FROM p_fence OR p_fence <= 0 THEN
        RETURN QUERY SELECT false, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
        RETURN;
    END IF;
    t := clock_timestamp();
    WITH ended AS (
        UPDATE guardedcron.runs r
           SET outcome = p_outcome, finished_at = t, reason = p_reason
         WHERE r.id = cur.run_id AND r.lock_name = p_lock AND r.outcome = 'running'
    )
    UPDATE guardedcron.leases l
       SET locked_until = greatest(l.min_hold_until, least(l.locked_until, t)),
           released_at = coalesce(l.released_at, t)
     WHERE l.lock_name = p_lock
    RETURNING l.* INTO cur;
    RETURN QUERY SELECT true, cur.holder, cur.fence, cur.locked_until, cur.run_id, t;
END
$$;
