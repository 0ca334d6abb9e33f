-- The message once (issue 15): a JSON record's message (its `message` or `msg` field) was stored
-- twice, in `record` and again in `message` — for records whose message is most of their bytes,
-- most of the row. Now:
--   * the table is `log_rows`, the partitions keep their names (`logs_YYYYMMDD`);
--   * `log_rows.message` holds a text record's line; a JSON record's is NULL (rows stored before
--     this migration keep theirs: nothing is rewritten);
--   * `logs` is a view over `log_rows` with every column the table had, `message` taken from the
--     record where the row does not hold it (`log_message`, below). Queries read `logs` as
--     before; `message = '…'` or `LIKE` on it reads the record of each JSON row it looks at.
-- `log_message` is the rule the persister applied in Rust until now (src/persist/row.rs): the
-- first of `message`, `msg` present at the top level of an object (the last value of a name
-- given twice, escapes in names decoded), if its value is a string; else none (a number, null
-- or object in `message` is no message, and `msg` is not looked at then). One difference: a
-- `message` holding a number serde_json cannot read (beyond f64, `1e400`) counted as absent in
-- Rust, so `msg` was used; here it is a number, so no message.
-- Grants move with the renamed table; every role that could read it gets SELECT on the view
-- too. From PostgreSQL 15 the view checks the reader's own rights on `log_rows` (and its
-- row-level security policies), not its owner's: reading `logs` needs SELECT on both.
-- Runs in place: a rename, a function and a view; no row is read or written. Persisters of the
-- previous version write into `logs` and fail (retried, not lost) until they are replaced.
SET LOCAL lock_timeout = '1min';
LOCK TABLE logs IN ACCESS EXCLUSIVE MODE;
SET LOCAL lock_timeout = 0;

ALTER TABLE logs RENAME TO log_rows;

-- A SQL function of one expression: the planner inlines it into the view's queries.
CREATE FUNCTION log_message(record json) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN record -> 'message' IS NOT NULL THEN
            CASE WHEN json_typeof(record -> 'message') = 'string' THEN record ->> 'message' END
        WHEN json_typeof(record -> 'msg') = 'string' THEN record ->> 'msg'
    END
$$;

CREATE VIEW logs AS
SELECT
    agent,
    seq,
    ingest_time,
    event_time,
    level,
    coalesce(message, log_message(record)) AS message,
    format,
    pod_name,
    pod_namespace,
    container_name,
    node_name,
    peer_pid,
    peer_uid,
    peer_gid,
    record,
    kafka_topic,
    kafka_partition,
    kafka_offset
FROM log_rows;

DO $$
DECLARE
    reader text;
BEGIN
    FOR reader IN
        SELECT DISTINCT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(role.rolname) END
        FROM pg_class AS class
        CROSS JOIN LATERAL aclexplode(class.relacl) AS acl
        LEFT JOIN pg_roles AS role ON role.oid = acl.grantee
        WHERE class.oid = 'log_rows'::regclass AND acl.privilege_type = 'SELECT'
    LOOP
        EXECUTE format('GRANT SELECT ON logs TO %s', reader);
    END LOOP;
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'ALTER VIEW logs SET (security_invoker = true)';
    END IF;
END
$$;

COMMENT ON VIEW logs IS 'One row per log record (sluice). Stored in log_rows; message is derived from record for JSON records.';
COMMENT ON COLUMN log_rows.message IS 'A text record''s line; NULL for a JSON record stored since migration V3 (the view logs derives it from record).';
