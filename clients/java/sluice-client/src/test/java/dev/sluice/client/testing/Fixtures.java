package dev.sluice.client.testing;

import dev.sluice.client.LogRecord;
import dev.sluice.client.Severity;
import dev.sluice.client.SluiceClient;
import dev.sluice.client.SluiceConfig;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.UnaryOperator;

/**
 * What a test makes on its socket path, and stops at its end: fake agents (stopped) and clients
 * (closed briefly), so that no thread or socket outlives the test.
 */
public final class Fixtures implements AutoCloseable {
    private final Path socket;
    private final List<FakeAgent> agents = new ArrayList<>();
    private final List<SluiceClient> clients = new ArrayList<>();
    /** What the clients would have written to stderr (kept here to keep the build's output quiet). */
    public final List<String> notices = new CopyOnWriteArrayList<>();

    /** {@code dir} must be short: a Unix socket path holds ~107 bytes. */
    public Fixtures(Path dir) {
        this.socket = dir.resolve("agent.sock");
    }

    public Path socket() {
        return socket;
    }

    /** A fake agent on the socket, not started. */
    public FakeAgent agent() {
        FakeAgent agent = new FakeAgent(socket);
        agents.add(agent);
        return agent;
    }

    /** A client on the socket with {@code options} applied to the defaults. */
    public SluiceClient client(UnaryOperator<SluiceConfig.Builder> options) {
        SluiceClient client = SluiceClient.create(options.apply(SluiceConfig.builder().socketPath(socket).notices(notices::add)).build());
        clients.add(client);
        return client;
    }

    public SluiceClient client() {
        return client(b -> b);
    }

    /** A record logged now. */
    public static LogRecord record(Severity level, String message) {
        Instant now = Instant.now();
        return new LogRecord().time(now.getEpochSecond(), now.getNano()).severity(level).logger("test")
                .thread(Thread.currentThread().getName()).message(message);
    }

    public static LogRecord info(String message) {
        return record(Severity.INFO, message);
    }

    @Override
    public void close() {
        for (SluiceClient client : clients) {
            client.close(Duration.ofMillis(200));
        }
        for (FakeAgent agent : agents) {
            agent.stop();
        }
    }
}
