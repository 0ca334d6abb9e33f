package dev.sluice.client;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.util.function.BooleanSupplier;

/**
 * One connection to the agent: a non-blocking Unix {@link SocketChannel} with a selector for the
 * sender's writes and another for the ACK reader's reads, so that each side waits in short ticks
 * (a stop, a due notice or a broken connection is noticed within one) and neither waits on the
 * other.
 *
 * <p>Must not: be touched by an application thread. Only the sender thread and this
 * connection's ACK reader use it, so an application thread's interrupt can never close it (a
 * {@code SocketChannel} is closed by an interrupt of the thread inside one of its calls).
 */
final class Connection {
    private final SocketChannel channel;
    private final Selector writeSelector;
    private final Selector readSelector;
    /** The queue's name for this connection; answers on another are stale. */
    volatile long gen;
    /** Set by whichever side finds the connection unusable first. */
    volatile boolean broken;
    /** Set when this client ends the connection itself: errors after that are its own doing. */
    volatile boolean shutting;
    /** When it was opened ({@link System#nanoTime()}): one that ends soon after is backed off from. */
    final long openedNanos = System.nanoTime();

    Connection(SocketChannel channel) throws IOException {
        this.channel = channel;
        channel.configureBlocking(false);
        Selector writes = Selector.open();
        Selector reads;
        try {
            reads = Selector.open();
        } catch (IOException e) {
            writes.close();
            throw e;
        }
        this.writeSelector = writes;
        this.readSelector = reads;
        channel.register(writeSelector, SelectionKey.OP_WRITE);
        channel.register(readSelector, SelectionKey.OP_READ);
    }

    /**
     * Writes what {@code buffer} holds; returns false if {@code stop} said so or the connection
     * broke first. While the agent is not reading, waits in ticks of {@code tickMillis}, running
     * {@code whileBlocked} after each.
     */
    boolean writeFully(ByteBuffer buffer, BooleanSupplier stop, long tickMillis, Runnable whileBlocked)
            throws IOException {
        while (buffer.hasRemaining()) {
            if (broken || stop.getAsBoolean()) {
                return false;
            }
            if (channel.write(buffer) == 0) {
                writeSelector.select(tickMillis);
                writeSelector.selectedKeys().clear();
                whileBlocked.run();
            }
        }
        return true;
    }

    /** Reads what is there, waiting at most {@code tickMillis} for it; 0 if nothing came, -1 at the end. */
    int read(ByteBuffer buffer, long tickMillis) throws IOException {
        int n = channel.read(buffer);
        if (n == 0) {
            readSelector.select(tickMillis);
            readSelector.selectedKeys().clear();
            n = channel.read(buffer);
        }
        return n;
    }

    /** Marks it broken and wakes whichever thread waits on it. */
    void shut() {
        shutting = true;
        broken = true;
        writeSelector.wakeup();
        readSelector.wakeup();
    }

    /** Shuts it and releases the socket and the selectors. Idempotent. */
    void close() {
        shut();
        closeQuietly(channel);
        closeQuietly(writeSelector);
        closeQuietly(readSelector);
    }

    static void closeQuietly(AutoCloseable closeable) {
        if (closeable == null) {
            return;
        }
        try {
            closeable.close();
        } catch (Exception e) {
            // Nothing to do: it is being given up.
        }
    }
}
