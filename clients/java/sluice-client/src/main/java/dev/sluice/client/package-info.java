/**
 * The core of the Sluice clients for Java: what every appender shares.
 *
 * <p>Owns the Java side of the agent's {@code lines} protocol (docs/PROTOCOL.md), plain and
 * acknowledged ({@code SLUICE/2} client sessions), and the contract of docs/CLIENTS.md: the
 * logging call only encodes one JSON line and offers it to a bounded queue ({@link
 * dev.sluice.client.SluiceClient#log}); one daemon thread, {@code sluice-sender}, does every
 * connect, write and read; every drop is counted ({@link dev.sluice.client.Stats}, the {@link
 * dev.sluice.client.SluiceClientMXBean}, one stderr line a minute at most, an in-band report);
 * {@code flush} and {@code close} wait at most their timeouts.
 *
 * <p>Must not: block or do I/O on the application's thread, take a lock across I/O, log through
 * any logger (it would log about itself into itself), or depend on anything beyond the JDK.
 *
 * <p>Map: {@code SluiceClient} (lifecycle, options via {@code SluiceConfig}) → {@code
 * RecordEncoder} (a {@code LogRecord} to one storable line; {@code JsonBuffer}, {@code
 * StackTrace}) → {@code RecordQueue} (the bound, the drop policy, every counter; {@code Drops}:
 * the drop counts, the in-band report, the notice) → {@code Sender} (the thread, the handshake,
 * the ACK reader) → {@code Connection} (the socket and its waits).
 */
package dev.sluice.client;
