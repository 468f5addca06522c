-- guardedcron schema, version 4: least privilege. A runtime role uses only the locks it
-- is granted, through the functions, and can write no table.
--
-- * One owner: the role that owns the schema (whoever first ran `db migrate`) owns every
--   table, sequence and function in it; this migration hands any stray object to it.
-- * Every entry point is SECURITY DEFINER (runs with the owner's rights, so runtime roles
--   need no table privilege) with a pinned search_path (pg_catalog first, pg_temp last),
--   and first checks that the caller may use the lock: SQLSTATE GC003 otherwise.
-- * The caller is session_user: the role that logged in. Inside a SECURITY DEFINER
--   function current_user is the owner, so it cannot be the caller; SET ROLE changes
--   current_user only, so it neither adds nor removes lock rights. A login role has the
--   grants of every role whose privileges it has (pg_has_role ... 'USAGE': membership
--   with INHERIT), as for table privileges. Roles with the owner's privileges (the owner,
--   its members, superusers) use every lock: they can write the tables anyway.
-- * Helpers (names starting with '_') are callable by the owner only.
-- * Runtime roles read `runs` through row-level security: only rows of locks they are
--   granted. Nothing else is readable to them but `schema_migrations`.
-- * Roles that could use the schema-3 functions (they had UPDATE on leases, which those
--   SECURITY INVOKER functions needed) keep working: they get the all-locks grant, with a
--   note saying why, and NOTICEs that `db migrate` prints. Their table privileges go.

CREATE TABLE guardedcron.lock_grants (
    role       oid         NOT NULL,  -- pg_roles.oid: a role dropped and re-created gets nothing
    prefix     text        NOT NULL,  -- '' is the all-locks grant
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    note       text        NOT NULL DEFAULT '',
    PRIMARY KEY (role, prefix)
);
COMMENT ON TABLE guardedcron.lock_grants IS
    'Which role may use which locks: every lock name that starts with one of its prefixes.';

-- The lock-name prefixes the session's role may use; {''} (every lock) for roles with the
-- owner's privileges. Runtime roles execute it: the `runs` policy calls it.
-- (PL/pgSQL rather than SQL functions: PostgreSQL 15 plans a SQL function that cannot be
-- inlined, as SECURITY DEFINER ones cannot, again on every call; PL/pgSQL keeps its plans.)
CREATE FUNCTION guardedcron.granted_prefixes_v1() RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    RETURN (SELECT CASE
        WHEN pg_has_role(session_user, n.nspowner, 'USAGE') THEN ARRAY['']
        ELSE coalesce((SELECT array_agg(DISTINCT g.prefix ORDER BY g.prefix)
                         FROM guardedcron.lock_grants g
                        WHERE pg_has_role(session_user, g.role, 'USAGE')), '{}')
        END
      FROM pg_namespace n WHERE n.nspname = 'guardedcron');
END
$$;

-- Raise GC003 unless the session's role may use p_lock. The message names the lock and
-- the role, never anything of the connection. Cheapest answers first: the owner's
-- shortcut, then the role's own grants (the primary key's index: a handful of rows
-- however many tenants there are), then grants of roles it inherits (a scan).
CREATE FUNCTION guardedcron._require_grant(p_lock text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    IF p_lock IS NOT NULL AND (
        pg_has_role(session_user,
                    (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'guardedcron'), 'USAGE')
        OR EXISTS (SELECT 1 FROM guardedcron.lock_grants g
                    WHERE g.role = session_user::text::regrole::oid AND starts_with(p_lock, g.prefix))
        OR EXISTS (SELECT 1 FROM guardedcron.lock_grants g
                    WHERE starts_with(p_lock, g.prefix)
                      AND pg_has_role(session_user, g.role, 'USAGE'))) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'guardedcron: lock "%" is not granted to role "%"', p_lock, session_user
        USING ERRCODE = 'GC003',
              HINT = format('An administrator grants it with: guardedcron db grant --role %s --lock-prefix PREFIX',
                            session_user);
END
$$;

-- For readers (`guardedcron runs`): refuse up front what row-level security would only
-- hide, so a tenant asking for another's lock gets GC003, not an empty history.
CREATE FUNCTION guardedcron.check_grant_v1(p_lock text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
END
$$;

-- The v2 bodies stay as they were, under helper names; the public names check first.
ALTER FUNCTION guardedcron.acquire_v2(text, text, double precision, double precision, bigint, integer, integer)
    RENAME TO _acquire_v2;
ALTER FUNCTION guardedcron.renew_v2(text, text, bigint, double precision) RENAME TO _renew_v2;
ALTER FUNCTION guardedcron.release_v2(text, text, bigint, text, text) RENAME TO _release_v2;

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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    RETURN QUERY SELECT * FROM guardedcron._acquire_v2(
        p_lock, p_holder, p_lease_seconds, p_min_hold_seconds, p_slot, p_retain_days, p_retain_runs);
END
$$;

CREATE FUNCTION guardedcron.renew_v2(
    p_lock text, p_holder text, p_fence bigint, p_lease_seconds double precision
) RETURNS TABLE (renewed boolean, holder text, fence bigint, locked_until timestamptz, db_now timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    RETURN QUERY SELECT * FROM guardedcron._renew_v2(p_lock, p_holder, p_fence, p_lease_seconds);
END
$$;

CREATE FUNCTION guardedcron.release_v2(
    p_lock text, p_holder text, p_fence bigint, p_outcome text, p_reason text
) RETURNS TABLE (released boolean, holder text, fence bigint, locked_until timestamptz,
                 run_id bigint, db_now timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    RETURN QUERY SELECT * FROM guardedcron._release_v2(p_lock, p_holder, p_fence, p_outcome, p_reason);
END
$$;

-- The library's answer to a contended attempt (row-busy) records its skip here: the
-- helper _record_skip is the owner's only.
CREATE FUNCTION guardedcron.record_skip_v1(
    p_lock text, p_holder text, p_slot bigint, p_reason text
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp AS $$
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
    RETURN guardedcron._record_skip(p_lock, p_holder, p_slot, p_reason, clock_timestamp());
END
$$;

CREATE OR REPLACE FUNCTION guardedcron.mark_lost_v1(
    p_lock text, p_holder text, p_fence bigint, p_reason text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    marked bigint;
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
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
LANGUAGE plpgsql AS $$
DECLARE
    marked integer;
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
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

-- As in version 3, with the grant checked before anything about the lock is read.
CREATE OR REPLACE FUNCTION guardedcron.check_fence(p_lock text, p_fence bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cur_fence  bigint;
    cur_holder text;
BEGIN
    PERFORM guardedcron._require_grant(p_lock);
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

-- Entry points: the owner's rights, a pinned path. (acquire_v1, renew_v1 and release_v1
-- call the checked v2 names; mark_lost_v1, mark_abandoned_v1 and check_fence check themselves.)
ALTER FUNCTION guardedcron.acquire_v1(text, text, double precision, double precision, bigint, integer, integer)
    SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron.renew_v1(text, text, bigint, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron.release_v1(text, text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron.mark_lost_v1(text, text, bigint, text)
    SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron.mark_abandoned_v1(text)
    SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron.check_fence(text, bigint)
    SECURITY DEFINER SET search_path = pg_catalog, guardedcron, pg_temp;
-- Helpers: a pinned path too (they run inside the entry points, as the owner).
ALTER FUNCTION guardedcron._record_skip(text, text, bigint, text, timestamptz)
    SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron._check_lease_seconds(text, double precision)
    SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron._next_fence(text, bigint)
    SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron._acquire_v2(text, text, double precision, double precision, bigint, integer, integer)
    SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron._renew_v2(text, text, bigint, double precision)
    SET search_path = pg_catalog, guardedcron, pg_temp;
ALTER FUNCTION guardedcron._release_v2(text, text, bigint, text, text)
    SET search_path = pg_catalog, guardedcron, pg_temp;

-- Runtime roles read the history of their own locks only. The owner (and roles with its
-- privileges, and superusers) are not subject to the policy; the functions run as the owner.
ALTER TABLE guardedcron.runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY runs_of_granted_locks ON guardedcron.runs FOR SELECT
    USING (lock_name ^@ ANY ((SELECT guardedcron.granted_prefixes_v1())::text[]));

-- What a runtime role gets from `db grant`, in one place: usage of the schema, the entry
-- points, and reading its own history and the schema version. Never a table write.
CREATE FUNCTION guardedcron._grant_runtime_privileges(p_role oid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, guardedcron, pg_temp AS $$
DECLARE
    who text := quote_ident(pg_get_userbyid(p_role));
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA guardedcron TO %s', who);
    EXECUTE format('GRANT EXECUTE ON FUNCTION'
        ' guardedcron.acquire_v1(text, text, double precision, double precision, bigint, integer, integer),'
        ' guardedcron.acquire_v2(text, text, double precision, double precision, bigint, integer, integer),'
        ' guardedcron.renew_v1(text, text, bigint, double precision),'
        ' guardedcron.renew_v2(text, text, bigint, double precision),'
        ' guardedcron.release_v1(text, text, text, text),'
        ' guardedcron.release_v2(text, text, bigint, text, text),'
        ' guardedcron.record_skip_v1(text, text, bigint, text),'
        ' guardedcron.mark_lost_v1(text, text, bigint, text),'
        ' guardedcron.mark_abandoned_v1(text),'
        ' guardedcron.check_fence(text, bigint),'
        ' guardedcron.check_grant_v1(text),'
        ' guardedcron.granted_prefixes_v1()'
        ' TO %s', who);
    EXECUTE format('GRANT SELECT ON guardedcron.runs, guardedcron.schema_migrations TO %s', who);
END
$$;

-- Upgrade: one owner, nothing for PUBLIC, schema-3 runtime roles carried over (said aloud).
DO $$
DECLARE
    owner_oid oid := (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'guardedcron');
    owner_name text := quote_ident(pg_get_userbyid(owner_oid));
    obj record;
    grantee oid;
BEGIN
    FOR obj IN
        SELECT format('%s %s', CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                      c.oid::regclass) AS what
          FROM pg_class c
         WHERE c.relnamespace = 'guardedcron'::regnamespace AND c.relkind IN ('r', 'p', 'S')
           AND c.relowner <> owner_oid
        UNION ALL
        SELECT format('FUNCTION %s', p.oid::regprocedure)
          FROM pg_proc p
         WHERE p.pronamespace = 'guardedcron'::regnamespace AND p.proowner <> owner_oid
    LOOP
        EXECUTE format('ALTER %s OWNER TO %s', obj.what, owner_name);
        RAISE NOTICE 'guardedcron: % now belongs to the schema owner %', obj.what, owner_name;
    END LOOP;

    -- Under schema 3 the functions ran with the caller's rights: a role that could use them
    -- had UPDATE on leases. It keeps every lock, as before; narrow it with db grant/revoke.
    FOR grantee IN
        SELECT DISTINCT (aclexplode(c.relacl)).grantee
          FROM pg_class c WHERE c.oid = 'guardedcron.leases'::regclass
    LOOP
        IF grantee = 0 THEN
            RAISE NOTICE 'guardedcron: PUBLIC had privileges on guardedcron.leases; they are revoked and '
                         'not carried over: grant roles by name with guardedcron db grant';
            CONTINUE;
        END IF;
        -- The owner and roles with its privileges use every lock without a grant.
        CONTINUE WHEN pg_has_role(grantee, owner_oid, 'USAGE');
        IF has_table_privilege(grantee, 'guardedcron.leases', 'UPDATE') THEN
            INSERT INTO guardedcron.lock_grants (role, prefix, note)
            VALUES (grantee, '', 'migration 4: could use the schema-3 functions (had UPDATE on guardedcron.leases)')
            ON CONFLICT DO NOTHING;
            PERFORM guardedcron._grant_runtime_privileges(grantee);
            RAISE NOTICE 'guardedcron: role % could use the schema-3 functions: it keeps every lock '
                         '(narrow it with guardedcron db grant/revoke)', pg_get_userbyid(grantee);
        END IF;
    END LOOP;

    -- No table, sequence or helper privilege for anyone but the owner.
    FOR grantee IN
        SELECT DISTINCT acl.grantee
          FROM pg_class c, aclexplode(c.relacl) acl
         WHERE c.relnamespace = 'guardedcron'::regnamespace AND c.relkind IN ('r', 'p', 'S')
           AND acl.grantee <> owner_oid
    LOOP
        IF grantee = 0 THEN
            EXECUTE 'REVOKE ALL ON ALL TABLES IN SCHEMA guardedcron FROM PUBLIC';
            EXECUTE 'REVOKE ALL ON ALL SEQUENCES IN SCHEMA guardedcron FROM PUBLIC';
        ELSE
            EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA guardedcron FROM %s',
                           quote_ident(pg_get_userbyid(grantee)));
            EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA guardedcron FROM %s',
                           quote_ident(pg_get_userbyid(grantee)));
            IF EXISTS (SELECT 1 FROM guardedcron.lock_grants g WHERE g.role = grantee) THEN
                EXECUTE format('GRANT SELECT ON guardedcron.runs, guardedcron.schema_migrations TO %s',
                               quote_ident(pg_get_userbyid(grantee)));
            ELSE
                RAISE NOTICE 'guardedcron: role % lost its privileges on guardedcron tables '
                             '(it could not use the schema-3 functions); grant it locks with guardedcron db grant',
                             pg_get_userbyid(grantee);
            END IF;
        END IF;
    END LOOP;
    EXECUTE 'REVOKE ALL ON ALL FUNCTIONS IN SCHEMA guardedcron FROM PUBLIC';
    -- Helpers are the owner's alone, whoever was given EXECUTE on them before.
    FOR obj IN
        SELECT format('REVOKE ALL ON FUNCTION %s FROM %s', p.oid::regprocedure,
                      quote_ident(pg_get_userbyid(acl.grantee))) AS what
          FROM pg_proc p, aclexplode(p.proacl) acl
         WHERE p.pronamespace = 'guardedcron'::regnamespace AND p.proname LIKE '\_%'
           AND acl.grantee NOT IN (0, owner_oid)
    LOOP
        EXECUTE obj.what;
    END LOOP;
    -- (Functions a later migration creates lose PUBLIC's EXECUTE in migrations.py, after it.)
    -- Re-grant the entry points to the roles that hold grants (the REVOKE above took
    -- EXECUTE from PUBLIC only, but a role may have relied on it).
    FOR grantee IN SELECT DISTINCT g.role FROM guardedcron.lock_grants g LOOP
        PERFORM guardedcron._grant_runtime_privileges(grantee);
    END LOOP;
END
$$;
