package dev.sluice.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * The sender thread: the only code that connects to the agent and writes to it.
 *
 * <p>Owns: connecting (lazily, when there is a record to send, and again after every failure
 * with jittered backoff, forever, a missing socket and a refused connection alike), the
 * acknowledged-mode handshake ({@code SLUICE/2 ACK session=… first=…}), writing queued lines in
 * batches (acknowledged mode: each prefixed with the time it was logged), writing due notices,
 * and in acknowledged mode a reader thread per connection that settles records on {@code ACK} /
 * {@code NAK}. After a lost connection, what it had not settled is sent again, in order, under
 * the same numbers, on the next one.
 *
 * <p>Must not: drop or reorder records (that is the queue's policy, applied on the callers'
 * side), hold the queue's lock while doing I/O, or keep the JVM alive (daemon threads; every
 * wait is a short tick, so a stop is seen at once).
 */
final class Sender {
    /** One write takes at most this many records or bytes (at least one record). */
    static final int BATCH_RECORDS = 1024;
    static final long BATCH_BYTES = 256 * 1024;
    /**
     * How long the sender lets a burst gather before it writes ({@link RecordQueue#linger}): a
     * record reaches the agent at most this much later, and a burst costs one write.
     */
    static final long LINGER_NANOS = TimeUnit.MILLISECONDS.toNanos(2);
    /** The longest idle wait (the sender is woken for records; this is a safety net). */
    static final long IDLE_NANOS = TimeUnit.SECONDS.toNanos(5);
    /** The longest single wait in a write or read: how soon a stop or a due notice is seen. */
    static final long IO_TICK_MILLIS = 250;
    /** The agent's {@code OK <ack point>} must come within this. */
    static final long HANDSHAKE_TIMEOUT_NANOS = TimeUnit.SECONDS.toNanos(5);
    /** An answer line longer than this is not the agent's. */
    private static final int MAX_ANSWER = 4096;

    private final RecordQueue queue;
    private final UnixDomainSocketAddress address;
    private final String socketPath;
    private final boolean acknowledged;
    private final Consumer<String> notices;
    private final String suffix;
    private final Thread thread;

    private volatile Connection conn;
    /** How long the last connection lost had lived (0 once the next connect decided its backoff on it). */
    private final java.util.concurrent.atomic.AtomicLong lostAfterNanos = new java.util.concurrent.atomic.AtomicLong();
    private volatile SocketChannel connecting;
    private boolean connectedBefore;

    // The writing side's buffers, reused for every batch.
    private final RecordQueue.Batch batch = new RecordQueue.Batch(BATCH_RECORDS);
    private final ByteBuffer out = ByteBuffer.allocateDirect(64 * 1024);
    private final byte[] digits = new byte[20];
    private long written;
    private String writeError;

    Sender(RecordQueue queue, SluiceConfig config) {
        this.queue = queue;
        this.socketPath = config.socketPath().toString();
        this.address = UnixDomainSocketAddress.of(config.socketPath());
        this.acknowledged = config.acknowledged();
        this.notices = config.notices();
        this.suffix = config.name() != null ? "-" + config.name() : "";
        this.thread = new Thread(this::run, "sluice-sender" + suffix);
        this.thread.setDaemon(true);
    }

    void start() {
        thread.start();
    }

    /**
     * After {@code queue.stop()}: ends the connection (and a connect the agent does not answer)
     * and waits up to {@code joinMillis} for the thread.
     */
    void shutdown(long joinMillis) {
        Connection.closeQuietly(connecting);
        Connection c = conn;
        if (c != null) {
            c.shut();
        }
        if (thread != Thread.currentThread()) {
            try {
                thread.join(joinMillis);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    // The sender thread. ------------------------------------------------------------------------

    /** What {@code lastError} says after the sender caught a Throwable of its own. */
    private static final String INTERNAL_ERROR = "internal error in the sender (it carries on)";

    private void run() {
        Backoff backoff = new Backoff();
        try {
            while (!queue.stopping()) {
                Thread.interrupted(); // an interrupt from elsewhere must not close the next channel
                try {
                    step(backoff);
                } catch (Throwable e) { // a bug, or an Error, here must not end shipping for good
                    try {
                        queue.connectFailed(INTERNAL_ERROR); // no allocation: the heap may be the trouble
                        Connection c = conn;
                        if (c != null) {
                            lose(c, null);
                        }
                        queue.sleep(backoff.next());
                    } catch (Throwable again) {
                        // Nothing to do but go round again; the loop itself allocates nothing.
                    }
                }
            }
        } finally {
            Connection c = conn;
            if (c != null) {
                c.close();
            }
        }
    }

    /** Waits for records; connects if need be; writes one batch. */
    private void step(Backoff backoff) {
        long due = queue.noticeDueInNanos();
        queue.waitForWork(due < 0 ? IDLE_NANOS : Math.min(due, IDLE_NANOS));
        writeNotice();
        if (queue.stopping() || !queue.hasPending()) {
            return;
        }
        queue.linger(LINGER_NANOS, BATCH_RECORDS / 2, BATCH_BYTES / 2);
        if (queue.stopping()) {
            return;
        }
        Connection c = conn;
        if (c == null || c.broken) {
            if (c != null) {
                lose(c, null);
            }
            long lived = lostAfterNanos.getAndSet(0);
            if (lived > 0) {
                if (lived < Backoff.LARGEST_NANOS) {
                    // The last connection ended soon after it opened (an agent that accepts and
                    // closes at once: over its max_connections, a peer it does not allow): back
                    // off as for a failed connect instead of connecting again at once.
                    queue.sleep(backoff.next());
                    return;
                }
                backoff.reset();
            }
            c = connect();
            if (c == null) {
                queue.sleep(backoff.next());
                return;
            }
        }
        if (acknowledged) {
            sendNumbered(c);
        } else {
            sendPlain(c);
        }
    }

    private Connection connect() {
        SocketChannel channel = null;
        Connection c = null;
        try {
            channel = SocketChannel.open(StandardProtocolFamily.UNIX);
            connecting = channel;
            if (queue.stopping()) {
                throw new ClosedChannelException();
            }
            // Blocking: a Unix socket connects or fails at once (a full backlog waits, and
            // shutdown() closes the channel to end that wait).
            channel.connect(address);
            c = new Connection(channel);
            String ackPoint = null;
            ByteBuffer leftover = null;
            if (acknowledged) {
                leftover = ByteBuffer.allocate(MAX_ANSWER * 2);
                ackPoint = handshake(c, leftover);
            }
            c.gen = queue.connectionOpened(ackPoint, connectedBefore);
            connectedBefore = true;
            conn = c;
            if (acknowledged) {
                Connection reading = c;
                ByteBuffer rest = leftover;
                Thread reader = new Thread(() -> readAcks(reading, rest), "sluice-acks" + suffix);
                reader.setDaemon(true);
                reader.start();
            }
            return c;
        } catch (IOException | RuntimeException e) {
            if (c != null) {
                c.close();
            } else {
                Connection.closeQuietly(channel);
            }
            queue.connectFailed(describe(e));
            return null;
        } finally {
            connecting = null;
        }
    }

    /**
     * Opens the session from the first record not acknowledged; returns the agent's ack point.
     * Bytes after its answer are left in {@code in} for the reader.
     */
    private String handshake(Connection c, ByteBuffer in) throws IOException {
        String hello = "SLUICE/2 ACK session=" + queue.session + " first=" + queue.firstUnsettled() + "\n";
        ByteBuffer request = ByteBuffer.wrap(hello.getBytes(StandardCharsets.US_ASCII));
        if (!c.writeFully(request, queue::stopping, IO_TICK_MILLIS, () -> {})) {
            throw new IOException("stopped during the handshake");
        }
        long deadline = System.nanoTime() + HANDSHAKE_TIMEOUT_NANOS;
        int newline;
        while ((newline = indexOf(in, (byte) '\n')) < 0) {
            if (in.position() > MAX_ANSWER) {
                throw new IOException("an unreadable answer to SLUICE/2 ACK");
            }
            if (queue.stopping()) {
                throw new IOException("stopped during the handshake");
            }
            if (System.nanoTime() - deadline > 0) {
                throw new IOException("no answer to SLUICE/2 ACK within 5 s");
            }
            if (c.read(in, IO_TICK_MILLIS) < 0) {
                throw new IOException("the agent closed the connection during the handshake");
            }
        }
        String answer = new String(in.array(), 0, newline, StandardCharsets.UTF_8).strip();
        in.flip();
        in.position(newline + 1);
        in.compact();
        String[] words = answer.split(" ");
        if (words.length != 2 || !words[0].equals("OK")) {
            throw new IOException("the agent answered '" + (answer.length() > 80 ? answer.substring(0, 80) : answer)
                    + "' to SLUICE/2 ACK");
        }
        return words[1];
    }

    private static int indexOf(ByteBuffer buffer, byte b) {
        byte[] array = buffer.array();
        for (int i = 0; i < buffer.position(); i++) {
            if (array[i] == b) {
                return i;
            }
        }
        return -1;
    }

    private void sendPlain(Connection c) {
        queue.peek(batch, BATCH_BYTES);
        if (batch.size == 0) {
            return;
        }
        write(c, false);
        // A record cut by a failed write stays queued and goes again whole on the next connection.
        int whole = 0;
        long end = 0;
        for (int k = 0; k < batch.size; k++) {
            end += batch.data[k].length;
            if (end > written) {
                break;
            }
            whole++;
        }
        queue.commit(batch, whole);
        batch.clear();
        if (writeError != null) {
            lose(c, writeError);
        }
    }

    private void sendNumbered(Connection c) {
        queue.take(c.gen, batch, BATCH_BYTES);
        if (batch.size == 0) {
            return;
        }
        write(c, true);
        batch.clear();
        if (writeError != null) {
            lose(c, writeError);
        }
    }

    /**
     * Writes the batch (numbered: each line {@code <unix µs> <record>}, the same on every send);
     * sets {@link #written} to the bytes that went and {@link #writeError} to why it stopped
     * short, if it did for a reason other than a broken connection.
     */
    private void write(Connection c, boolean numbered) {
        written = 0;
        writeError = null;
        out.clear();
        for (int k = 0; k < batch.size; k++) {
            if (numbered) {
                if (out.remaining() < digits.length + 1 && !drain(c)) {
                    return;
                }
                putDecimal(batch.times[k]);
                out.put((byte) ' ');
            }
            byte[] line = batch.data[k];
            int at = 0;
            while (at < line.length) {
                if (!out.hasRemaining() && !drain(c)) {
                    return;
                }
                int n = Math.min(out.remaining(), line.length - at);
                out.put(line, at, n);
                at += n;
            }
        }
        drain(c);
    }

    private boolean drain(Connection c) {
        out.flip();
        try {
            boolean done = c.writeFully(out, queue::stopping, IO_TICK_MILLIS, this::writeNotice);
            written += out.position();
            out.clear();
            if (!done && queue.stopping()) {
                writeError = "stopped";
            }
            return done;
        } catch (IOException e) {
            written += out.position();
            out.clear();
            writeError = describe(e);
            return false;
        }
    }

    private void putDecimal(long value) {
        int n = 0;
        long v = Math.max(value, 0);
        do {
            digits[n++] = (byte) ('0' + v % 10);
            v /= 10;
        } while (v != 0);
        while (n > 0) {
            out.put(digits[--n]);
        }
    }

    private void lose(Connection c, String error) {
        c.close();
        queue.connectionLost(c.gen, error);
        if (conn == c) {
            conn = null;
            lostAfterNanos.set(Math.max(System.nanoTime() - c.openedNanos, 1));
        }
    }

    private void writeNotice() {
        String line = queue.takeNotice(socketPath);
        if (line == null) {
            return;
        }
        try {
            notices.accept(line);
        } catch (RuntimeException e) {
            // A broken stderr or status listener: the counters still say it.
        }
    }

    // The ACK reader (acknowledged mode, one thread per connection). ---------------------------

    private void readAcks(Connection c, ByteBuffer in) {
        String error = null;
        try {
            while (!c.broken && !queue.stopping()) {
                Thread.interrupted(); // an interrupt would make every select return at once: a spin
                settle(c, in);
                if (in.position() > MAX_ANSWER) {
                    error = "an unreadable answer from the agent";
                    break;
                }
                if (c.read(in, IO_TICK_MILLIS) < 0) {
                    settle(c, in);
                    error = "the agent closed the connection";
                    break;
                }
            }
        } catch (IOException | RuntimeException e) {
            error = describe(e);
        } catch (Throwable e) { // an Error: the connection is given up all the same (finally)
            error = INTERNAL_ERROR;
        } finally {
            // Whatever ended the reader, the sender must see the connection gone, or records sent
            // on it would wait for acknowledgements that nobody reads.
            c.broken = true;
            queue.connectionLost(c.gen, c.shutting ? null : error);
        }
    }

    /** Handles every whole line in {@code in} and keeps the rest. */
    private void settle(Connection c, ByteBuffer in) {
        byte[] a = in.array();
        int start = 0;
        for (int i = 0; i < in.position(); i++) {
            if (a[i] == '\n') {
                answer(c, a, start, i);
                start = i + 1;
            }
        }
        if (start > 0) {
            in.flip();
            in.position(start);
            in.compact();
        }
    }

    /** {@code ACK <n>} or {@code NAK <n> <reason>}; a line this version does not know is ignored. */
    private void answer(Connection c, byte[] a, int from, int to) {
        if (to > from && a[to - 1] == '\r') {
            to--;
        }
        boolean ack = startsWith(a, from, to, "ACK ");
        if (!ack && !startsWith(a, from, to, "NAK ")) {
            return;
        }
        int i = from + 4;
        long n = 0;
        int digitsRead = 0;
        while (i < to && a[i] >= '0' && a[i] <= '9' && digitsRead < 19) {
            n = n * 10 + (a[i++] - '0');
            digitsRead++;
        }
        if (digitsRead == 0) {
            return;
        }
        if (ack) {
            if (i == to) {
                queue.ack(c.gen, n);
            }
        } else if (i < to && a[i] == ' ') {
            queue.nak(c.gen, n, new String(a, i + 1, to - i - 1, StandardCharsets.US_ASCII).strip());
        }
    }

    private static boolean startsWith(byte[] a, int from, int to, String prefix) {
        if (to - from < prefix.length()) {
            return false;
        }
        for (int i = 0; i < prefix.length(); i++) {
            if (a[from + i] != prefix.charAt(i)) {
                return false;
            }
        }
        return true;
    }

    /** A short word for an error: {@code ENOENT}, {@code ECONNREFUSED}…, or the exception's words. */
    static String describe(Throwable e) {
        String message = e.getMessage();
        if (message != null) {
            if (message.contains("No such file or directory")) {
                return "ENOENT";
            }
            if (message.contains("Connection refused")) {
                return "ECONNREFUSED";
            }
            if (message.contains("Permission denied")) {
                return "EACCES";
            }
            if (message.contains("Broken pipe")) {
                return "EPIPE";
            }
            if (message.contains("Connection reset")) {
                return "ECONNRESET";
            }
            return e.getClass().getSimpleName() + ": " + message;
        }
        return e.getClass().getSimpleName();
    }
}
