package dev.sluice.example.orders;

import java.sql.Timestamp;
import java.util.Map;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Repository;

/**
 * The seed's DAO: one log entry costs nine synchronous statements, each on a connection
 * borrowed from the pool and committed on its own (no transaction), as a stopgap DAO does.
 * The {@code request_log} insert is the one the stall fault slows down (a trigger the run
 * script adds), so about 3% of log entries stall, as in the seed. Exists in sync-jdbc mode only.
 */
@Repository
@ConditionalOnProperty(name = "logging.mode", havingValue = "sync-jdbc")
public class RequestLogDao {
    private static final String API = "GET /orders/{id}";

    private final JdbcTemplate jdbc;

    public RequestLogDao(JdbcTemplate jdbc) {
        this.jdbc = jdbc;
        createTables();
    }

    /** Plain tables in the connection's schema (the run script points currentSchema at its own). */
    private void createTables() {
        jdbc.execute("""
                CREATE TABLE IF NOT EXISTS request_log (
                    id          bigint PRIMARY KEY,
                    request_id  text NOT NULL,
                    seq         bigint NOT NULL,
                    api         text,
                    method      text NOT NULL,
                    path        text NOT NULL,
                    order_id    bigint,
                    status      integer NOT NULL,
                    duration_ms double precision NOT NULL,
                    logged_at   timestamptz NOT NULL
                )""");
        jdbc.execute("CREATE SEQUENCE IF NOT EXISTS request_log_id_seq");
        jdbc.execute("CREATE INDEX IF NOT EXISTS request_log_request_id ON request_log (request_id)");
        jdbc.execute("""
                CREATE TABLE IF NOT EXISTS request_log_mdc (
                    log_id bigint NOT NULL,
                    key    text NOT NULL,
                    value  text,
                    PRIMARY KEY (log_id, key)
                )""");
        jdbc.execute("""
                CREATE TABLE IF NOT EXISTS request_log_daily (
                    day      date NOT NULL,
                    api      text NOT NULL,
                    requests bigint NOT NULL,
                    PRIMARY KEY (day, api)
                )""");
        jdbc.execute("""
                CREATE TABLE IF NOT EXISTS api_catalog (
                    api         text PRIMARY KEY,
                    owner       text NOT NULL,
                    last_called timestamptz
                )""");
        jdbc.update("INSERT INTO api_catalog (api, owner) VALUES (?, 'orders-team') ON CONFLICT DO NOTHING", API);
    }

    /** Nine statements, one after another. */
    public void insertLog(LogDto dto) {
        Long id = jdbc.queryForObject("SELECT nextval('request_log_id_seq')", Long.class); // 1
        String owner = jdbc.query("SELECT owner FROM api_catalog WHERE api = ?", // 2
                rs -> rs.next() ? rs.getString(1) : null, API);
        jdbc.update("""
                INSERT INTO request_log (id, request_id, seq, api, method, path, order_id, status, duration_ms, logged_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""", // 3: the stall fault's trigger is on this table
                id, dto.requestId(), dto.seq(), owner == null ? null : API, dto.method(), dto.path(),
                dto.orderId(), dto.status(), dto.durationMs(), Timestamp.from(dto.loggedAt()));
        for (Map.Entry<String, String> entry : dto.mdc().entrySet()) { // 4-6: request_id, seq, client
            jdbc.update("INSERT INTO request_log_mdc (log_id, key, value) VALUES (?, ?, ?)",
                    id, entry.getKey(), entry.getValue());
        }
        jdbc.update("""
                INSERT INTO request_log_daily (day, api, requests) VALUES (current_date, ?, 1)
                ON CONFLICT (day, api) DO UPDATE SET requests = request_log_daily.requests + 1""", API); // 7
        jdbc.update("UPDATE api_catalog SET last_called = now() WHERE api = ?", API); // 8
        jdbc.queryForObject("SELECT count(*) FROM request_log_mdc WHERE log_id = ?", Integer.class, id); // 9
    }
}
