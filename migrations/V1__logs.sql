-- One row per log record. Partitioned by day on ingest_time (the agent's clock, so a record
-- always lands in the same partition however often it is redelivered). The primary key makes
-- redelivery harmless: the persister inserts with ON CONFLICT DO NOTHING.
CREATE TABLE logs (
    record_id       text        NOT NULL,
    ingest_time     timestamptz NOT NULL,
    event_time      timestamptz,
    level           text,
    message         text,
    format          text        NOT NULL,
    pod_name        text,
    pod_namespace   text,
    container_name  text,
    node_name       text,
    peer_pid        integer,
    peer_uid        bigint,
    peer_gid        bigint,
    record          jsonb       NOT NULL,
    payload         text        NOT NULL,
    kafka_topic     text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    PRIMARY KEY (record_id, ingest_time)
) PARTITION BY RANGE (ingest_time);

CREATE INDEX logs_ingest_time ON logs (ingest_time);
CREATE INDEX logs_pod_time ON logs (pod_namespace, pod_name, ingest_time);

-- Kafka messages that are not sluice envelopes, or cannot be stored as rows (NUL bytes), kept
-- byte for byte so nothing is lost silently.
CREATE TABLE dead_letters (
    kafka_topic     text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    reason          text        NOT NULL,
    error           text        NOT NULL,
    payload         bytea,
    PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset)
);
