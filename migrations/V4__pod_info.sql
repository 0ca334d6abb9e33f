-- The pod's labels and annotations (issue 32, `[agent.pod_info]`): two jsonb columns, NULL for
-- rows of agents that read none and for every row stored before this migration. Adding a
-- nullable column without a default rewrites nothing: it is a catalog change, instant on any
-- table size. The view `logs` gains them at its end (CREATE OR REPLACE keeps its grants;
-- security_invoker is set again, as V3 set it).
ALTER TABLE log_rows ADD COLUMN pod_labels jsonb, ADD COLUMN pod_annotations jsonb;

CREATE OR REPLACE VIEW logs AS
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
    kafka_offset,
    pod_labels,
    pod_annotations
FROM log_rows;

DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'ALTER VIEW logs SET (security_invoker = true)';
    END IF;
END
$$;

COMMENT ON COLUMN log_rows.pod_labels IS 'The pod''s labels its agent kept (agent.pod_info), or NULL.';
COMMENT ON COLUMN log_rows.pod_annotations IS 'The pod''s annotations its agent kept (agent.pod_info), or NULL.';
