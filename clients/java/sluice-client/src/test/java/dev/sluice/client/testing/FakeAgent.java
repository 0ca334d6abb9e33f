package dev.sluice.client.testing;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BiFunction;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A small in-process stand-in for the agent's {@code lines} listener (docs/PROTOCOL.md), the
 * Java twin of {@code clients/python/tests/fake_agent.py}.
 *
 * <p>It accepts connections on a Unix socket, collects the records and checks each as the agent
 * does (size, UTF-8, NUL and its JSON escape, lone surrogate escapes, depth). A connection that
 * opens with {@code SLUICE/1 ACK} or a client session's {@code SLUICE/2 ACK session=… first=…}
 * (each line then {@code <unix µs> <record>}) is answered {@code OK <ack point>}, then {@code
 * NAK n reason} / {@code ACK n} with the session's own numbers; each session record is kept as
 * {@link Numbered}. It can be stopped and started again on the same path, told to stop reading
 * ({@link #stall()}), to hold its ACKs, or to drop its connections.
 *
 * <p>Must not: leave a thread or a socket file behind: {@link #stop()} ends every connection
 * first (so no line is taken in after it returns), joins its threads and removes the file.
 */
public final class FakeAgent implements AutoCloseable {
    public static final int MAX_RECORD_SIZE = 1024 * 1024;
    public static final int MAX_JSON_DEPTH = 64;

    private static final Pattern SESSION = Pattern.compile("SLUICE/2 ACK session=([0-9a-f]{32}) first=([1-9][0-9]*)");

    /** A refused line and the agent's reason. */
    public record Rejected(String reason, String line) {}

    /** A {@code SLUICE/2} handshake: the session and the number of the connection's first record. */
    public record Session(String id, long first) {}

    /** One line of a client session: its session, number, time and record. */
    public record Numbered(String session, long n, long timeMicros, String record) {}

    private final Path path;
    private volatile String ackPoint = "spooled";
    private volatile BiFunction<Long, String, String> nak;
    private volatile int maxRecordSize = MAX_RECORD_SIZE;
    private volatile boolean holdAcks;
    private volatile boolean reading = true;
    private volatile boolean running;

    private final Object lock = new Object();
    private final List<String> lines = new ArrayList<>();
    private final List<Rejected> rejected = new ArrayList<>();
    private final List<Session> sessions = new ArrayList<>();
    private final List<Numbered> numbered = new ArrayList<>();
    private int connections;

    private ServerSocketChannel server;
    private final List<SocketChannel> open = new CopyOnWriteArrayList<>();
    private final List<Thread> threads = new CopyOnWriteArrayList<>();

    public FakeAgent(Path path) {
        this.path = path;
    }

    /** The answer to a handshake: {@code spooled} (default) or {@code delivered}. */
    public FakeAgent ackPoint(String point) {
        this.ackPoint = point;
        return this;
    }

    /** Extra refusals: {@code (n, record) -> reason}, or null to take the record. */
    public FakeAgent nak(BiFunction<Long, String, String> decide) {
        this.nak = decide;
        return this;
    }

    public FakeAgent maxRecordSize(int bytes) {
        this.maxRecordSize = bytes;
        return this;
    }

    // Lifecycle. --------------------------------------------------------------------------------

    public FakeAgent start() throws IOException {
        ServerSocketChannel channel = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        channel.bind(UnixDomainSocketAddress.of(path), 64);
        server = channel;
        running = true;
        Thread acceptor = new Thread(this::accept, "fake-agent-accept");
        acceptor.setDaemon(true);
        threads.add(acceptor);
        acceptor.start();
        return this;
    }

    /** Closes the listener and every connection and removes the socket file. */
    public void stop() {
        running = false;
        reading = true;
        for (SocketChannel channel : open) {
            closeQuietly(channel);
        }
        closeQuietly(server);
        for (Thread thread : threads) {
            try {
                thread.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        threads.clear();
        open.clear();
        server = null;
        try {
            Files.deleteIfExists(path);
        } catch (IOException e) {
            throw new IllegalStateException("remove " + path, e);
        }
    }

    public void restart() throws IOException {
        stop();
        start();
    }

    @Override
    public void close() {
        stop();
    }

    /** Stop reading every connection (the client's writes fill the socket, then wait). */
    public void stall() {
        reading = false;
    }

    public void resume() {
        reading = true;
    }

    /** While true, ACKs are owed but not sent (NAKs still are). */
    public void holdAcks(boolean hold) {
        this.holdAcks = hold;
    }

    /** Ends every open connection, as an agent that closes them (the listener stays). */
    public void dropConnections() {
        for (SocketChannel channel : open) {
            closeQuietly(channel);
        }
    }

    // What arrived. -----------------------------------------------------------------------------

    public List<String> lines() {
        synchronized (lock) {
            return List.copyOf(lines);
        }
    }

    public List<Map<String, Object>> records() {
        List<Map<String, Object>> records = new ArrayList<>();
        for (String line : lines()) {
            records.add(Json.object(line));
        }
        return records;
    }

    /** The messages of the records, without the client's own drop reports. */
    public List<String> messages() {
        List<String> messages = new ArrayList<>();
        for (Map<String, Object> record : records()) {
            if (!record.containsKey("sluice.client")) {
                messages.add((String) record.get("message"));
            }
        }
        return messages;
    }

    public List<Rejected> rejected() {
        synchronized (lock) {
            return List.copyOf(rejected);
        }
    }

    public List<Session> sessions() {
        synchronized (lock) {
            return List.copyOf(sessions);
        }
    }

    public List<Numbered> numbered() {
        synchronized (lock) {
            return List.copyOf(numbered);
        }
    }

    public int connections() {
        synchronized (lock) {
            return connections;
        }
    }

    public boolean waitFor(Predicate<FakeAgent> condition, Duration timeout) {
        return Waiting.until(() -> condition.test(this), timeout);
    }

    public boolean waitForLines(int count) {
        return waitFor(agent -> agent.lines().size() >= count, Duration.ofSeconds(5));
    }

    /** The records, once {@code count} have arrived; fails if fewer came or the agent would refuse any. */
    public List<Map<String, Object>> expect(int count) {
        if (!waitForLines(count)) {
            throw new AssertionError(lines().size() + " of " + count + " records arrived");
        }
        if (!rejected().isEmpty()) {
            throw new AssertionError("the agent would refuse: " + rejected());
        }
        return records();
    }

    // Serving. ----------------------------------------------------------------------------------

    private void accept() {
        while (running) {
            SocketChannel channel;
            try {
                channel = server.accept();
            } catch (IOException e) {
                return; // closed by stop()
            }
            synchronized (lock) {
                connections++;
            }
            open.add(channel);
            Thread thread = new Thread(() -> serve(channel), "fake-agent-conn");
            thread.setDaemon(true);
            threads.add(thread);
            thread.start();
        }
    }

    private void serve(SocketChannel channel) {
        try (Selector selector = Selector.open()) {
            channel.configureBlocking(false);
            channel.register(selector, SelectionKey.OP_READ);
            Connection state = new Connection();
            ByteBuffer in = ByteBuffer.allocate(64 * 1024);
            byte[] pending = new byte[0];
            while (running) {
                if (!reading) {
                    Thread.sleep(20);
                    continue;
                }
                if (state.acknowledged && !holdAcks && state.owedAck > 0) {
                    state.replies.append("ACK ").append(state.owedAck).append('\n');
                    state.owedAck = 0;
                }
                if (state.replies.length() > 0) {
                    ByteBuffer out = ByteBuffer.wrap(state.replies.toString().getBytes(StandardCharsets.US_ASCII));
                    while (out.hasRemaining() && running) {
                        if (channel.write(out) == 0) {
                            Thread.sleep(5);
                        }
                    }
                    state.replies.setLength(0);
                }
                selector.select(50);
                selector.selectedKeys().clear();
                in.clear();
                int n = channel.read(in);
                if (n < 0) {
                    return;
                }
                if (n == 0) {
                    continue;
                }
                byte[] joined = new byte[pending.length + n];
                System.arraycopy(pending, 0, joined, 0, pending.length);
                System.arraycopy(in.array(), 0, joined, pending.length, n);
                int start = 0;
                for (int i = 0; i < joined.length; i++) {
                    if (joined[i] == '\n') {
                        int end = i > start && joined[i - 1] == '\r' ? i - 1 : i;
                        byte[] line = new byte[end - start];
                        System.arraycopy(joined, start, line, 0, line.length);
                        take(state, line);
                        start = i + 1;
                    }
                }
                pending = new byte[joined.length - start];
                System.arraycopy(joined, start, pending, 0, pending.length);
            }
        } catch (IOException e) {
            // The connection ended (or stop() closed it).
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            closeQuietly(channel);
        }
    }

    private static final class Connection {
        boolean first = true;
        boolean acknowledged;
        String session;
        long number;
        long owedAck;
        final StringBuilder replies = new StringBuilder();
    }

    private void take(Connection state, byte[] line) {
        if (state.first) {
            state.first = false;
            String text = new String(line, StandardCharsets.UTF_8);
            Matcher session = SESSION.matcher(text);
            boolean isSession = session.matches();
            if (text.equals("SLUICE/1 ACK") || isSession) {
                state.acknowledged = true;
                if (isSession) {
                    state.session = session.group(1);
                    state.number = Long.parseLong(session.group(2)) - 1;
                    synchronized (lock) {
                        sessions.add(new Session(state.session, state.number + 1));
                    }
                }
                state.replies.append("OK ").append(ackPoint).append('\n');
                return;
            }
        }
        state.number++;
        byte[] record = line;
        if (state.session != null) {
            int space = 0;
            while (space < line.length && space < 20 && line[space] >= '0' && line[space] <= '9') {
                space++;
            }
            if (space == 0 || space >= line.length || line[space] != ' ') {
                refuse(state, "malformed", line);
                return;
            }
            long time = Long.parseLong(new String(line, 0, space, StandardCharsets.US_ASCII));
            record = new byte[line.length - space - 1];
            System.arraycopy(line, space + 1, record, 0, record.length);
            synchronized (lock) {
                numbered.add(new Numbered(state.session, state.number, time, new String(record, StandardCharsets.UTF_8)));
            }
        }
        String reason = check(record, maxRecordSize);
        BiFunction<Long, String, String> decide = nak;
        if (reason == null && decide != null) {
            reason = decide.apply(state.number, new String(record, StandardCharsets.UTF_8));
        }
        if (reason != null) {
            refuse(state, reason, record);
            return;
        }
        synchronized (lock) {
            lines.add(new String(record, StandardCharsets.UTF_8));
            lock.notifyAll();
        }
        if (state.acknowledged) {
            state.owedAck = state.number;
        }
    }

    private void refuse(Connection state, String reason, byte[] record) {
        synchronized (lock) {
            rejected.add(new Rejected(reason, new String(record, StandardCharsets.UTF_8)));
        }
        if (state.acknowledged) {
            state.replies.append("NAK ").append(state.number).append(' ').append(reason).append('\n');
            state.owedAck = state.number;
        }
    }

    /** The agent's reason to refuse {@code line} (without its newline), or null. */
    public static String check(byte[] line, int maxRecordSize) {
        if (line.length > maxRecordSize) {
            return "too_large";
        }
        if (line.length == 0) {
            return "empty";
        }
        try {
            StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(line));
        } catch (CharacterCodingException e) {
            return "invalid_utf8";
        }
        for (byte b : line) {
            if (b == 0) {
                return "contains_nul";
            }
        }
        if (line[0] != '{') {
            return null;
        }
        int depth = 0;
        int deepest = 0;
        boolean inString = false;
        boolean escaped = false;
        for (byte b : line) {
            if (inString) {
                if (escaped) {
                    escaped = false;
                } else if (b == '\\') {
                    escaped = true;
                } else if (b == '"') {
                    inString = false;
                }
            } else if (b == '"') {
                inString = true;
            } else if (b == '{' || b == '[') {
                deepest = Math.max(deepest, ++depth);
            } else if (b == '}' || b == ']') {
                depth--;
            }
        }
        if (deepest > MAX_JSON_DEPTH) {
            return "too_deep";
        }
        String text = new String(line, StandardCharsets.UTF_8);
        for (int i = 0; i + 1 < text.length(); i++) {
            if (text.charAt(i) != '\\') {
                continue;
            }
            char kind = text.charAt(i + 1);
            if (kind != 'u' || i + 6 > text.length()) {
                i++;
                continue;
            }
            int unit = Integer.parseInt(text.substring(i + 2, i + 6), 16);
            if (unit == 0) {
                return "contains_nul";
            }
            if (unit >= 0xD800 && unit <= 0xDBFF) {
                boolean paired = i + 12 <= text.length() && text.startsWith("\\u", i + 6)
                        && isLow(Integer.parseInt(text.substring(i + 8, i + 12), 16));
                if (!paired) {
                    return "unpaired_surrogate";
                }
                i += 11;
                continue;
            }
            if (isLow(unit)) {
                return "unpaired_surrogate";
            }
            i += 5;
        }
        return null;
    }

    private static boolean isLow(int unit) {
        return unit >= 0xDC00 && unit <= 0xDFFF;
    }

    private static void closeQuietly(AutoCloseable closeable) {
        if (closeable == null) {
            return;
        }
        try {
            closeable.close();
        } catch (Exception e) {
            // Being given up.
        }
    }
}
