package dev.sluice.client.testing;

import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.Proxy;
import java.net.URI;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The real pipeline as child processes, for the tests that run an appender against it: {@code
 * sluice agent} on a temp socket shipping to the stack's Kafka ({@code SLUICE_TEST_KAFKA}) on a
 * topic no other run uses, and {@code sluice persist} reading that topic into a schema of its own
 * in the stack's PostgreSQL ({@code SLUICE_TEST_PG}), read back with JDBC. The Java twin of
 * {@code clients/python/tests/real_agent.py}, plus the persister.
 *
 * <p>Owns: writing both configs (admin servers on {@code 127.0.0.1:0}, their addresses read from
 * {@code admin_address_file}; checked once with {@code sluice check-config}), starting each
 * process and waiting for {@code /readyz} to answer {@code ready}, stopping them by pid (SIGTERM
 * and wait; SIGKILL where a test means it), and reading rows. The topic is created by the
 * agent's producer (the stack's broker auto-creates topics), so the agent starts first.
 *
 * <p>Must not: start anything but those two, listen beyond loopback, or leave a process or a
 * schema behind ({@link #close()} stops both and drops the schema).
 */
public final class RealPipeline implements AutoCloseable {
    /** How long a process may take to answer {@code /readyz} with {@code ready}. */
    static final Duration READY_TIMEOUT = Duration.ofSeconds(30);
    /** How long a SIGTERM'd process may drain (its {@code drain_timeout} is 5 s) before it is killed. */
    static final Duration STOP_TIMEOUT = Duration.ofSeconds(15);

    private static final AtomicInteger COUNTER = new AtomicInteger();

    /** The environment {@code scripts/test} sets. */
    public record Env(Path binary, String kafka, String postgres, String postgresCa) {
        /**
         * The environment, or null when {@code SLUICE_BIN} is unset (the real-agent tests are then
         * skipped); with it set, the services must be named too.
         */
        public static Env fromEnvironment() {
            String binary = System.getenv("SLUICE_BIN");
            if (binary == null || binary.isBlank()) {
                return null;
            }
            String kafka = System.getenv("SLUICE_TEST_KAFKA");
            String postgres = System.getenv("SLUICE_TEST_PG");
            if (kafka == null || kafka.isBlank() || postgres == null || postgres.isBlank()) {
                throw new IllegalStateException(
                        "SLUICE_BIN is set, so SLUICE_TEST_KAFKA and SLUICE_TEST_PG must be too (`scripts/stack env`)");
            }
            String ca = System.getenv("SLUICE_TEST_PG_CA");
            return new Env(Path.of(binary), kafka, postgres, ca == null || ca.isBlank() ? null : ca);
        }
    }

    /** The agent's buffer and acknowledgement point. */
    public record Options(String buffer, String ackPoint, String maxRecordSize) {
        public static Options memory() {
            return new Options("memory", null, null);
        }

        /** A disk spool with {@code ack_point = "spooled"}: an ACK survives the agent's SIGKILL. */
        public static Options spooled() {
            return new Options("disk", "spooled", null);
        }

        public Options maxRecordSize(String size) {
            return new Options(buffer, ackPoint, size);
        }
    }

    private final Env env;
    private final Path dir;
    private final Path socket;
    public final String topic;
    public final String schema;
    private final Path agentConfig;
    private final Path persistConfig;
    private final Service agent;
    private final Service persister;
    private Connection db;

    private RealPipeline(Env env, Path dir, Options options) throws IOException {
        this.env = env;
        this.dir = dir;
        this.socket = dir.resolve("agent.sock");
        String unique = ProcessHandle.current().pid() + "_" + COUNTER.incrementAndGet() + "_" + (System.nanoTime() % 1_000_000_000L);
        this.topic = "javaclient_" + unique;
        this.schema = "javaclient_" + unique;
        this.agentConfig = dir.resolve("agent.toml");
        this.persistConfig = dir.resolve("persist.toml");
        Files.writeString(agentConfig, agentToml(options));
        Files.writeString(persistConfig, persistToml());
        this.agent = new Service("agent", agentConfig, dir.resolve("agent.admin"), dir.resolve("agent.log"));
        this.persister = new Service("persist", persistConfig, dir.resolve("persist.admin"), dir.resolve("persist.log"));
        checkConfig(agentConfig);
        checkConfig(persistConfig);
    }

    /** Writes the configs in {@code dir} (a short path: the socket goes there). Nothing starts yet. */
    public static RealPipeline create(Env env, Path dir, Options options) throws IOException {
        return new RealPipeline(env, dir, options);
    }

    public Path socket() {
        return socket;
    }

    private String agentToml(Options options) {
        StringBuilder toml = new StringBuilder();
        toml.append("[log]\nlevel = \"info,librdkafka=warn\"\nformat = \"json\"\n");
        toml.append("[kafka]\nbrokers = \"").append(env.kafka()).append("\"\ntopic = \"").append(topic).append("\"\n");
        toml.append("[agent]\nadmin_listen = \"127.0.0.1:0\"\nadmin_address_file = \"")
                .append(dir.resolve("agent.admin")).append("\"\ndrain_timeout = \"5s\"\n");
        toml.append("[ingest]\n");
        if (options.ackPoint() != null) {
            toml.append("ack_point = \"").append(options.ackPoint()).append("\"\n");
        }
        toml.append("[ingest.listeners.default]\nprotocol = \"lines\"\nsocket = \"").append(socket).append("\"\n");
        if (options.maxRecordSize() != null) {
            toml.append("max_record_size = \"").append(options.maxRecordSize()).append("\"\n");
        }
        toml.append("[buffer]\ntype = \"").append(options.buffer()).append("\"\n");
        if (options.buffer().equals("disk")) {
            toml.append("path = \"").append(dir.resolve("spool")).append("\"\nfsync = \"10ms\"\n");
        }
        return toml.toString();
    }

    private String persistToml() {
        String url = env.postgres();
        StringBuilder toml = new StringBuilder();
        toml.append("[log]\nlevel = \"info,librdkafka=warn\"\nformat = \"json\"\n");
        toml.append("[kafka]\nbrokers = \"").append(env.kafka()).append("\"\ntopic = \"").append(topic).append("\"\n");
        toml.append("[persist]\nadmin_listen = \"127.0.0.1:0\"\nadmin_address_file = \"")
                .append(dir.resolve("persist.admin")).append("\"\n");
        toml.append("group_id = \"").append(topic).append("\"\nbatch_max_wait = \"100ms\"\ndrain_timeout = \"5s\"\n");
        toml.append("[persist.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n");
        // The stack's PostgreSQL offers TLS with its own CA: verified when the CA is named, else
        // plaintext (with TLS the persister always verifies).
        if (env.postgresCa() == null && !url.contains("sslmode=")) {
            url = url + (url.contains("?") ? "&" : "?") + "sslmode=disable";
        }
        toml.append("[postgres]\nurl = \"").append(url).append("\"\nschema = \"").append(schema).append("\"\n");
        if (env.postgresCa() != null) {
            toml.append("ca_file = \"").append(env.postgresCa()).append("\"\n");
        }
        return toml.toString();
    }

    private void checkConfig(Path config) throws IOException {
        Process check = new ProcessBuilder(env.binary().toString(), "check-config", config.toString())
                .redirectErrorStream(true)
                .redirectOutput(dir.resolve("check-config.out").toFile())
                .start();
        try {
            if (!check.waitFor(30, TimeUnit.SECONDS)) {
                check.destroyForcibly().waitFor();
                throw new IllegalStateException("sluice check-config " + config + " did not finish");
            }
        } catch (InterruptedException e) {
            check.destroyForcibly();
            Thread.currentThread().interrupt();
            throw new IOException(e);
        }
        if (check.exitValue() != 0) {
            throw new IllegalStateException("sluice check-config " + config + " failed:\n"
                    + Files.readString(dir.resolve("check-config.out")));
        }
    }

    // Processes. --------------------------------------------------------------------------------

    public void startAgent() throws IOException {
        agent.start();
    }

    /** SIGTERM, and wait for the drain (SIGKILL only if it outlives {@link #STOP_TIMEOUT}); returns the exit code. */
    public int stopAgent() {
        return agent.stop();
    }

    /** SIGKILL: no drain. */
    public void killAgent() {
        agent.kill();
    }

    /**
     * SIGSTOP (by pid): the agent reads and answers nothing until it is killed, so what a client
     * writes from now on waits for its acknowledgement however fast the agent was.
     */
    public void freezeAgent() throws IOException, InterruptedException {
        agent.signal("STOP");
    }

    public boolean agentRunning() {
        return agent.running();
    }

    public void startPersister() throws IOException {
        persister.start();
    }

    public String agentLog() {
        return agent.logTail();
    }

    public String persisterLog() {
        return persister.logTail();
    }

    /** One {@code sluice agent} / {@code sluice persist} child: started and stopped by pid, as often as a test likes. */
    private final class Service {
        private final String role;
        private final Path config;
        private final Path adminFile;
        private final Path log;
        private Process process;
        private int starts;

        Service(String role, Path config, Path adminFile, Path log) {
            this.role = role;
            this.config = config;
            this.adminFile = adminFile;
            this.log = log;
        }

        void start() throws IOException {
            if (running()) {
                throw new IllegalStateException(role + " is already running");
            }
            Files.deleteIfExists(adminFile); // a restart binds another port: wait for the new one
            starts++;
            Files.writeString(log, "--- start " + starts + "\n", StandardCharsets.UTF_8,
                    java.nio.file.StandardOpenOption.CREATE, java.nio.file.StandardOpenOption.APPEND);
            process = new ProcessBuilder(env.binary().toString(), role, "--config", config.toString())
                    .directory(dir.toFile())
                    .redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()))
                    .redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")))
                    .start();
            long deadline = System.nanoTime() + READY_TIMEOUT.toNanos();
            String admin = null;
            while (true) {
                if (!process.isAlive()) {
                    throw new IllegalStateException(role + " exited (" + process.exitValue() + "); log:\n" + logTail());
                }
                if (System.nanoTime() - deadline > 0) {
                    throw new IllegalStateException(role + " was not ready in time; log:\n" + logTail());
                }
                if (admin == null && Files.exists(adminFile)) {
                    String address = Files.readString(adminFile).strip();
                    admin = address.isEmpty() ? null : address;
                }
                if (admin != null && "ready".equals(get(admin, "/readyz"))) {
                    return;
                }
                sleep(50);
            }
        }

        boolean running() {
            return process != null && process.isAlive();
        }

        int stop() {
            if (process == null) {
                return -1;
            }
            if (process.isAlive()) {
                process.destroy(); // SIGTERM
                try {
                    if (!process.waitFor(STOP_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS)) {
                        process.destroyForcibly().waitFor();
                    }
                } catch (InterruptedException e) {
                    process.destroyForcibly();
                    Thread.currentThread().interrupt();
                }
            }
            return waitExit();
        }

        void signal(String name) throws IOException, InterruptedException {
            if (process != null && process.isAlive()) {
                int exit = new ProcessBuilder("kill", "-" + name, Long.toString(process.pid())).inheritIO().start().waitFor();
                if (exit != 0) {
                    throw new IOException("kill -" + name + " " + process.pid() + " exited " + exit);
                }
            }
        }

        void kill() {
            if (process != null && process.isAlive()) {
                process.destroyForcibly(); // SIGKILL
            }
            waitExit();
        }

        private int waitExit() {
            try {
                return process.waitFor();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return -1;
            }
        }

        String logTail() {
            try {
                List<String> lines = Files.readAllLines(log, StandardCharsets.UTF_8);
                return String.join("\n", lines.subList(Math.max(0, lines.size() - 30), lines.size()));
            } catch (IOException e) {
                return "(no log)";
            }
        }
    }

    /** The body of {@code GET http://admin/path} (loopback, never through a proxy), or null. */
    private static String get(String admin, String path) {
        try {
            URL url = URI.create("http://" + admin + path).toURL();
            HttpURLConnection http = (HttpURLConnection) url.openConnection(Proxy.NO_PROXY);
            http.setConnectTimeout(2000);
            http.setReadTimeout(5000);
            try {
                if (http.getResponseCode() != 200) {
                    return null;
                }
                try (InputStream body = http.getInputStream()) {
                    return new String(body.readAllBytes(), StandardCharsets.UTF_8).strip();
                }
            } finally {
                http.disconnect();
            }
        } catch (IOException e) {
            return null; // not listening yet, or gone
        }
    }

    private static void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted", e);
        }
    }

    // PostgreSQL. -------------------------------------------------------------------------------

    private Connection db() throws SQLException {
        if (db == null) {
            db = DriverManager.getConnection(jdbcUrl(env.postgres()) + "&currentSchema=" + schema);
        }
        return db;
    }

    /** {@code postgres://user[:password]@host:port/db} as a JDBC URL (TLS if offered, unverified: a test reads). */
    static String jdbcUrl(String url) {
        URI uri = URI.create(url);
        StringBuilder jdbc = new StringBuilder("jdbc:postgresql://").append(uri.getHost());
        if (uri.getPort() > 0) {
            jdbc.append(':').append(uri.getPort());
        }
        jdbc.append(uri.getPath() == null || uri.getPath().isEmpty() ? "/postgres" : uri.getPath());
        jdbc.append("?sslmode=prefer");
        String userInfo = uri.getUserInfo();
        if (userInfo != null) {
            String[] parts = userInfo.split(":", 2);
            jdbc.append("&user=").append(parts[0]);
            if (parts.length == 2) {
                jdbc.append("&password=").append(parts[1]);
            }
        }
        return jdbc.toString();
    }

    /** The first column of the first row of {@code sql}, a number (the search path is this pipeline's schema). */
    public long scalar(String sql) throws SQLException {
        try (Statement statement = db().createStatement();
                ResultSet rows = statement.executeQuery(sql)) {
            rows.next();
            return rows.getLong(1);
        }
    }

    /** The first column of every row of {@code sql}, as text. */
    public List<String> strings(String sql) throws SQLException {
        List<String> out = new ArrayList<>();
        try (Statement statement = db().createStatement();
                ResultSet rows = statement.executeQuery(sql)) {
            while (rows.next()) {
                out.add(rows.getString(1));
            }
        }
        return out;
    }

    /** Every stored record's JSON text. */
    public List<String> records() throws SQLException {
        return strings("SELECT record::text FROM logs ORDER BY ingest_time, seq");
    }

    /** Rows in {@code logs} (0 while the persister has not made the table yet). */
    public long rows() {
        try {
            return scalar("SELECT count(*) FROM logs");
        } catch (SQLException e) {
            return 0;
        }
    }

    /** Waits until {@code logs} holds at least {@code count} rows; fails with both logs if it does not. */
    public void waitForRows(long count, Duration timeout) {
        if (!Waiting.until(() -> rows() >= count, timeout)) {
            throw new AssertionError(rows() + " of " + count + " rows arrived; agent log:\n" + agentLog()
                    + "\npersister log:\n" + persisterLog());
        }
    }

    @Override
    public void close() {
        persister.stop();
        agent.stop();
        try {
            if (db != null) {
                try (Statement statement = db.createStatement()) {
                    statement.execute("DROP SCHEMA IF EXISTS \"" + schema + "\" CASCADE");
                }
                db.close();
            }
        } catch (SQLException e) {
            // The schema stays; its name is unique.
        }
    }
}
