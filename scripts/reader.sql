-- A reader database over several Sluice clusters (docs/SCALING.md, "Reading across clusters"),
-- with what PostgreSQL ships: postgres_fdw foreign tables over each cluster's view `logs`, and
-- one view `sluice_reader.logs` over them all with a `cluster` column. Filters on the view are
-- pushed down to each cluster (its own indexes do the work), and the clusters are scanned at the
-- same time (`async_capable`, PostgreSQL 14+). Nothing is copied; no Sluice process is involved.
--
-- Run once in the reader database (scripts/reader does, with psql), then once per cluster:
--   SELECT sluice_reader.add_cluster('team_a', 'pg-a.example', 5432, 'logs', 'sluice', 'reader');
-- and read:
--   SELECT cluster, ingest_time, pod_namespace, message FROM sluice_reader.logs
--   WHERE pod_namespace = 'team-a' AND ingest_time > '2026-12-07 05:00+00';
-- Give times as values: postgres_fdw ships no stable function, so `now() - interval '1 hour'`
-- would be applied here, after every cluster sent all of the namespace's rows.
-- A cluster's reader role needs SELECT on its `logs` and `log_rows` (PostgreSQL 15+ checks the
-- reader's own rights through the view). A password, if the cluster asks for one, goes in the
-- user mapping (postgres_fdw requires one for a role that is not a superuser).

CREATE EXTENSION IF NOT EXISTS postgres_fdw;
CREATE SCHEMA IF NOT EXISTS sluice_reader;

-- The union of every cluster added so far (servers named sluice_<name>).
CREATE OR REPLACE FUNCTION sluice_reader.refresh_view() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    parts text[];
BEGIN
    SELECT array_agg(format('SELECT %L::text AS cluster, * FROM %I.logs', substr(srvname, 8), srvname)
                     ORDER BY srvname)
      INTO parts
      FROM pg_foreign_server
     WHERE srvname LIKE 'sluice\_%';
    IF parts IS NULL THEN
        RAISE EXCEPTION 'no cluster added yet: SELECT sluice_reader.add_cluster(...)';
    END IF;
    EXECUTE 'CREATE OR REPLACE VIEW sluice_reader.logs AS ' || array_to_string(parts, ' UNION ALL ');
END $$;

-- Adds cluster `name`, or replaces it when called again (a new host after a failover, a new
-- password): a server sluice_<name> (connect_timeout 10 s: a cluster that is away fails a query
-- in seconds instead of hanging it; give readers a statement_timeout too), a user mapping for the
-- current role, the cluster's view `logs` imported as sluice_<name>.logs, and the union view.
-- Replacing drops what was built on the old foreign table (views of your own included).
CREATE OR REPLACE FUNCTION sluice_reader.add_cluster(
    name text, host text, port integer, dbname text, remote_schema text, username text,
    password text DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    server text := 'sluice_' || name;
BEGIN
    IF name !~ '^[a-z0-9_]+$' THEN
        RAISE EXCEPTION 'cluster name %: lower-case letters, digits and _ only', name;
    END IF;
    EXECUTE format('DROP SERVER IF EXISTS %I CASCADE', server);
    EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER postgres_fdw '
                   'OPTIONS (host %L, port %L, dbname %L, async_capable %L, fetch_size %L, connect_timeout %L)',
                   server, host, port::text, dbname, 'true', '10000', '10');
    EXECUTE format('CREATE USER MAPPING FOR CURRENT_USER SERVER %I OPTIONS (user %L%s)',
                   server, username,
                   CASE WHEN password IS NULL THEN '' ELSE format(', password %L', password) END);
    EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', server);
    EXECUTE format('DROP FOREIGN TABLE IF EXISTS %I.logs CASCADE', server);
    EXECUTE format('IMPORT FOREIGN SCHEMA %I LIMIT TO (logs) FROM SERVER %I INTO %I',
                   remote_schema, server, server);
    PERFORM sluice_reader.refresh_view();
END $$;

-- Removes cluster `name` (its server, user mappings, foreign table and schema) from the reader;
-- the union view then covers the others. Nothing on the cluster itself is touched.
CREATE OR REPLACE FUNCTION sluice_reader.remove_cluster(name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP SERVER IF EXISTS %I CASCADE', 'sluice_' || name);
    EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', 'sluice_' || name);
    IF EXISTS (SELECT 1 FROM pg_foreign_server WHERE srvname LIKE 'sluice\_%') THEN
        PERFORM sluice_reader.refresh_view();
    ELSE
        DROP VIEW IF EXISTS sluice_reader.logs;
    END IF;
END $$;
