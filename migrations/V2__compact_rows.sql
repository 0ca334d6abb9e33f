-- Compact rows (issue 15): a row held its record twice (`record jsonb` and `payload text`; a
-- text record three times, with `message`) under a text primary key. Now:
--   * the key is the record id split into `agent uuid` + `seq bigint` (see RecordKey in
--     src/persist/row.rs; the expressions below compute the same key for rows stored before);
--   * `record` is `json`, the exact text of a JSON record (NULL for a text record, whose line is
--     `message`), and `payload` is gone: the record as written is `coalesce(record::text, message)`;
--   * the time index is BRIN: rows arrive in ingest_time order, so a few pages per range answer
--     "what happened between t1 and t2" at a fraction of a btree's size;
--   * the pod index is (pod_namespace, pod_name) without ingest_time: a pod's rows share one key,
--     which btree deduplication stores once per posting list (7 B per row instead of 59 B, measured
--     on 100,000 rows of one pod). "Pod X between t1 and t2" is a BitmapAnd of both indexes.
-- Runs in place, in one transaction holding an ACCESS EXCLUSIVE lock on `logs` (readers wait):
-- the old indexes are dropped first, every stored row is rewritten once (one ALTER TABLE
-- computing every new column from the old ones, the dropped columns' bytes left behind), then
-- the key and the indexes are built once. Plan for the time and for about the table's size
-- again while it runs (the rows it rewrote hold no dropped column's bytes). It fails, changing nothing, on a database where other objects use the
-- columns it changes (a view on `logs`, a jsonb-only index on `record` such as
-- `jsonb_path_ops`, a generated column): drop them, upgrade, create them again for `json`.

-- A role's or database's timeouts must not cancel it halfway, every start again. Waiting for
-- the table is bounded: a long query or a dump holding it fails this start (the persister
-- exits and is started again) rather than queueing every reader and writer behind this lock.
SET LOCAL statement_timeout = 0;
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 170000 THEN
        PERFORM set_config('transaction_timeout', '0', true);
    END IF;
END
$$;
SET LOCAL lock_timeout = '1min';
LOCK TABLE logs IN ACCESS EXCLUSIVE MODE;
SET LOCAL lock_timeout = 0;

-- The hashed agent of an instance (or of a whole id) that is not an agent's own uuid: the first
-- 16 bytes of its SHA-256, variant bits 111 (AgentId::hashed).
CREATE FUNCTION pg_temp.hashed_agent(text) RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(set_byte(digest, 8, (get_byte(digest, 8) & 31) | 224), 'hex')::uuid
    FROM substring(sha256(convert_to($1, 'UTF8')) FROM 1 FOR 16) AS digest
$$;

DROP INDEX logs_ingest_time;
DROP INDEX logs_pod_time;
ALTER TABLE logs DROP CONSTRAINT logs_pkey;
ALTER TABLE logs
    ADD COLUMN agent uuid,
    ADD COLUMN seq bigint,
    ALTER COLUMN record DROP NOT NULL,
    ALTER COLUMN payload DROP NOT NULL,
    ALTER COLUMN record_id DROP NOT NULL;

-- The one rewrite: each USING reads the row as it was. A text record's line is its payload (V1
-- wrote the same text to message).
ALTER TABLE logs
    ALTER COLUMN seq TYPE bigint USING CASE
        WHEN record_id ~ '-(0|[1-9][0-9]{0,17})$' THEN substring(record_id FROM '-([0-9]+)$')::bigint
        ELSE -1
    END,
    ALTER COLUMN agent TYPE uuid USING CASE
        WHEN record_id ~ '^[0-9a-f]{16}[89ab][0-9a-f]{15}-(0|[1-9][0-9]{0,17})$'
            THEN substring(record_id FROM 1 FOR 32)::uuid
        WHEN record_id ~ '-(0|[1-9][0-9]{0,17})$'
            THEN pg_temp.hashed_agent(substring(record_id FROM '^(.*)-[0-9]+$'))
        ELSE pg_temp.hashed_agent(record_id)
    END,
    ALTER COLUMN message TYPE text USING CASE WHEN format = 'json' THEN message ELSE payload END,
    ALTER COLUMN record TYPE json USING CASE WHEN format = 'json' THEN payload::json END,
    ALTER COLUMN payload TYPE text USING NULL,
    ALTER COLUMN record_id TYPE text USING NULL;

ALTER TABLE logs
    DROP COLUMN record_id,
    DROP COLUMN payload,
    ALTER COLUMN agent SET NOT NULL,
    ALTER COLUMN seq SET NOT NULL;
ALTER TABLE logs ADD PRIMARY KEY (agent, seq, ingest_time);
CREATE INDEX logs_ingest_time ON logs USING brin (ingest_time);
CREATE INDEX logs_pod ON logs (pod_namespace, pod_name);

-- Records longer than ~2 KB are compressed; lz4 costs a fraction of pglz's CPU. Set on `logs`
-- (partitions created later take it) and on every partition (SET COMPRESSION does not recurse,
-- and the partitions ahead are where rows go next). After the rewrite: a type change resets a
-- column's compression, so the rows it rewrote keep pglz. A server before PostgreSQL 14, or
-- built without lz4, keeps its default.
DO $$
DECLARE
    part regclass;
BEGIN
    IF current_setting('server_version_num')::int < 140000 THEN
        RAISE NOTICE 'PostgreSQL before 14 has no lz4 compression; record and message keep the default';
        RETURN;
    END IF;
    FOR part IN SELECT relid FROM pg_partition_tree('logs'::regclass) LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN record SET COMPRESSION lz4, ALTER COLUMN message SET COMPRESSION lz4', part);
    END LOOP;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'lz4 is not supported by this server; record and message keep the default compression';
END
$$;
