package dev.sluice.client;

import static dev.sluice.client.testing.Fixtures.info;
import static dev.sluice.client.testing.Fixtures.record;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.sluice.client.testing.FakeAgent;
import dev.sluice.client.testing.Fixtures;
import dev.sluice.client.testing.Waiting;
import java.lang.management.ManagementFactory;
import java.lang.ref.WeakReference;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.IntStream;
import javax.management.MBeanServer;
import javax.management.ObjectName;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The client against the fake agent: lifecycle, reconnects, bounded waits, acknowledged mode. */
class SluiceClientTest {
    private static final String PAYLOAD = "p".repeat(1000);

    @TempDir
    Path dir;

    private Fixtures fixtures;

    @BeforeEach
    void setUp() {
        fixtures = new Fixtures(dir);
    }

    @AfterEach
    void tearDown() {
        fixtures.close();
    }

    @Test
    void aValueWhoseToStringThrowsAnErrorIsCountedFormatErrorAndTheCallReturns() throws Exception {
        SluiceClient client = fixtures.client(b -> b);
        Object hostile = new Object() {
            @Override
            public String toString() {
                throw new AssertionError("not meant to be printed");
            }
        };
        client.log(info("kept"));
        boolean queued = client.log(info("with a hostile value").field("value", hostile));
        if (!queued) {
            assertEquals(Map.of("format_error", Map.of("info", 1L)), client.stats().dropped());
        }
    }

    @Test
    void aRecordWithoutATimeIsStampedNowNotAt1970() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        SluiceClient client = fixtures.client(b -> b);
        long before = RecordQueue.nowMicros();
        client.log(new LogRecord().severity(Severity.INFO).logger("test").message("no time given"));
        assertTrue(client.flush(Duration.ofSeconds(5)));
        assertTrue(agent.waitFor(a -> a.records().size() == 1, Duration.ofSeconds(5)));
        String time = (String) agent.records().get(0).get("time");
        assertTrue(time.compareTo(java.time.Instant.ofEpochSecond(before / 1_000_000).toString().substring(0, 19)) >= 0, time);
    }

    @Test
    void theSenderStartsWithTheFirstRecordNotBefore() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        SluiceClient client = fixtures.client();
        Thread.sleep(50);
        assertEquals(0, agent.connections(), "no connection before there is something to send");

        client.log(info("first"));

        assertEquals(List.of("first"), messagesOf(agent, 1));
        assertEquals(1, agent.connections());
    }

    private static List<String> messagesOf(FakeAgent agent, int count) {
        agent.expect(count);
        return agent.messages();
    }

    @Test
    void flushReturnsTrueOnceEverythingIsWritten() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        SluiceClient client = fixtures.client();
        for (int i = 0; i < 1000; i++) {
            client.log(info("record " + i));
        }

        assertTrue(client.flush(Duration.ofSeconds(5)));

        Stats stats = client.stats();
        assertEquals(1000, stats.sent());
        assertEquals(0, stats.queuedRecords());
        assertEquals(IntStream.range(0, 1000).mapToObj(i -> "record " + i).toList(), messagesOf(agent, 1000));
    }

    @Test
    void theSenderConnectsWhenTheSocketAppearsLater() throws Exception {
        SluiceClient client = fixtures.client();
        client.log(info("before the agent"));
        assertTrue(Waiting.until(() -> "ENOENT".equals(client.stats().lastError())), client.stats().toString());

        FakeAgent agent = fixtures.agent().start();

        assertEquals(List.of("before the agent"), messagesOf(agent, 1));
        assertEquals(0, client.stats().reconnects(), "the first connection is not a reconnect");
    }

    @Test
    void aRefusedConnectionIsRetriedLikeAMissingSocket() throws Exception {
        ServerSocketChannel stale = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        stale.bind(UnixDomainSocketAddress.of(fixtures.socket()));
        stale.close(); // the file stays, nobody listens: connect() gets ECONNREFUSED
        SluiceClient client = fixtures.client();
        client.log(info("waits for the agent"));
        assertTrue(Waiting.until(() -> "ECONNREFUSED".equals(client.stats().lastError())), client.stats().toString());

        Files.delete(fixtures.socket());
        FakeAgent agent = fixtures.agent().start();

        assertEquals(List.of("waits for the agent"), messagesOf(agent, 1));
    }

    @Test
    void anAgentThatClosesEveryConnectionAtOnceIsConnectedToWithBackoffNotInALoop() throws Exception {
        // As the agent does over its max_connections, or for a peer it does not allow.
        java.util.concurrent.atomic.AtomicInteger accepted = new java.util.concurrent.atomic.AtomicInteger();
        try (ServerSocketChannel server = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
            server.bind(UnixDomainSocketAddress.of(fixtures.socket()));
            Thread closer = new Thread(() -> {
                while (server.isOpen()) {
                    try {
                        server.accept().close();
                        accepted.incrementAndGet();
                    } catch (java.io.IOException e) {
                        return;
                    }
                }
            });
            closer.setDaemon(true);
            closer.start();
            SluiceClient client = fixtures.client(b -> b);
            long deadline = System.nanoTime() + Duration.ofSeconds(1).toNanos();
            while (System.nanoTime() < deadline) {
                client.log(info("into a closed door"));
                Thread.sleep(1);
            }
        }
        // 20 ms doubling to 2 s: about seven connections in a second, not one per record written.
        assertTrue(accepted.get() <= 15, accepted.get() + " connections in a second");
    }

    @Test
    void theSenderReconnectsAfterTheAgentRestarts() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        SluiceClient client = fixtures.client();
        client.log(info("first"));
        agent.expect(1);

        agent.stop();
        for (int i = 0; i < 5; i++) {
            client.log(info("during the restart " + i)); // queued; the first write after the stop fails
        }
        Thread.sleep(100);
        agent.start();

        List<String> expected = List.of("first", "during the restart 0", "during the restart 1", "during the restart 2",
                "during the restart 3", "during the restart 4");
        assertEquals(expected, messagesOf(agent, 6));
        assertTrue(client.stats().reconnects() >= 1);
    }

    /** Found by the cold review (issue 31): the encoder's stack-trace walk kept the exceptions it saw. */
    @Test
    void theLoggingThreadKeepsNoExceptionItLoggedAlive() {
        SluiceClient client = fixtures.client(b -> b);
        WeakReference<Throwable> logged = logAnException(client);
        assertTrue(Waiting.until(() -> {
            System.gc();
            return logged.get() == null;
        }, Duration.ofSeconds(10)), "the exception is still reachable after the call");
    }

    private static WeakReference<Throwable> logAnException(SluiceClient client) {
        Throwable failure = new IllegalStateException("card declined", new RuntimeException("gateway timeout"));
        client.log(record(Severity.ERROR, "payment failed").thrown(failure));
        return new WeakReference<>(failure);
    }

    @Test
    void loggingReturnsAtOnceAndCountsDropsWhileTheAgentIsAbsent() {
        SluiceClient client = fixtures.client(b -> b.maxQueueRecords(1000));
        long started = System.nanoTime();

        int accepted = 0;
        for (int i = 0; i < 20_000; i++) {
            accepted += client.log(record(i % 2 == 0 ? Severity.INFO : Severity.ERROR, "while nobody listens " + i)) ? 1 : 0;
        }

        // Each call only encoded and enqueued: 20,000 of them take milliseconds, where one
        // connect or write waited on would take a timeout. The bound is for a busy machine.
        assertTrue(System.nanoTime() - started < Duration.ofSeconds(5).toNanos(), "the calls waited for something");
        Stats stats = client.stats();
        assertFalse(stats.connected());
        assertEquals(1000, stats.queuedRecords());
        assertEquals(1000, accepted);
        assertEquals(19_000, stats.droppedTotal());
        assertTrue(stats.dropped(DropReason.HIGH_WATER, Severity.INFO) > 0, "info went first, above the high-water mark");
        assertTrue(stats.dropped(DropReason.FULL, Severity.ERROR) > 0);
        assertEquals(0, stats.dropped(DropReason.HIGH_WATER, Severity.ERROR), "errors are kept to the last slot");
    }

    @Test
    void anInterruptedApplicationThreadCannotBreakTheConnection() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        SluiceClient client = fixtures.client();
        client.log(info("before"));
        agent.expect(1);
        AtomicReference<Boolean> stillInterrupted = new AtomicReference<>();

        Thread app = new Thread(() -> {
            Thread.currentThread().interrupt();
            for (int i = 0; i < 100; i++) {
                client.log(info("interrupted " + i));
            }
            client.flush(Duration.ofSeconds(5)); // returns at once: the caller is interrupted
            stillInterrupted.set(Thread.currentThread().isInterrupted());
        });
        app.start();
        app.join(5000);

        assertEquals(Boolean.TRUE, stillInterrupted.get(), "the app's interrupt is left as it was");
        assertTrue(client.flush(Duration.ofSeconds(5)));
        assertEquals(101, agent.expect(101).size());
        assertEquals(1, agent.connections(), "the same connection throughout");
        assertEquals(0, client.stats().reconnects());
    }

    @Test
    void closeReturnsWithinItsTimeoutWhenTheAgentStallsAndCountsWhatWasLeft() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        List<String> notices = new java.util.concurrent.CopyOnWriteArrayList<>();
        SluiceClient client = fixtures.client(b -> b.maxQueueBytes(64 << 20).maxQueueRecords(100_000).notices(notices::add));
        client.log(info("connect first"));
        agent.expect(1);
        agent.stall();
        for (int i = 0; i < 5000; i++) { // 5 MB: far more than the socket buffers hold
            client.log(info(PAYLOAD));
        }
        assertTrue(Waiting.until(() -> client.stats().sent() > 1), "the sender wrote until the socket filled");
        assertTrue(client.stats().queuedRecords() > 0, "the sender waits on the stalled agent");

        long started = System.nanoTime();
        client.close(Duration.ofMillis(500));
        long took = System.nanoTime() - started;

        // The deadline, the sender's stop and room for a busy machine; below a close that waits
        // the default (2 s, and the sender's stop) or for the stalled agent.
        assertTrue(took < Duration.ofMillis(1800).toNanos(), "close took " + took / 1_000_000 + " ms");
        Stats stats = client.stats();
        long closed = stats.dropped(DropReason.CLOSED, Severity.INFO);
        assertTrue(closed > 0, "what was still queued is counted");
        assertTrue(notices.stream().anyMatch(n -> n.startsWith("sluice client: closed;") && n.contains("closed=")), notices.toString());
        assertFalse(client.log(info("after close")));
        assertEquals(closed + 1, client.stats().dropped(DropReason.CLOSED, Severity.INFO));
    }

    @Test
    void closeWaitsOnlyOnceForAnAgentThatTakesNothing() {
        SluiceClient client = fixtures.client(); // no agent at all
        client.log(info("never delivered"));
        long started = System.nanoTime();

        assertFalse(client.flush(Duration.ofMillis(300)));
        client.close(Duration.ofSeconds(5)); // as a framework's shutdown does: flush, then close

        // A close that waited again would take its 5 s.
        assertTrue(System.nanoTime() - started < Duration.ofMillis(4000).toNanos());
        assertEquals(1, client.stats().dropped(DropReason.CLOSED));
    }

    @Test
    void theDropReportReachesTheAgentOnceThereIsRoomAgain() throws Exception {
        SluiceClient client = fixtures.client(b -> b.maxQueueRecords(3));
        for (int i = 0; i < 10; i++) {
            client.log(record(Severity.WARN, "record " + i));
        }
        FakeAgent agent = fixtures.agent().start();

        List<Map<String, Object>> records = agent.expect(4);
        assertTrue(Waiting.until(() -> client.stats().reportsSent() == 1));

        Map<String, Object> report = records.get(3);
        assertEquals("dropped", report.get("sluice.client"));
        assertEquals(7L, report.get("count"));
        assertEquals(Map.of("full", 7L), report.get("by_reason"));
        assertEquals(Map.of("warn", 7L), report.get("by_level"));
        assertTrue(report.get("since") instanceof String);
        assertEquals(List.of("record 0", "record 1", "record 2"), agent.messages());
    }

    // Acknowledged mode. ------------------------------------------------------------------------

    /** Three records the agent never acknowledges; then it restarts and acknowledges from then on. */
    private SluiceClient threeUnacknowledgedThenTheAgentRestarts(FakeAgent agent) throws Exception {
        agent.holdAcks(true);
        agent.start();
        SluiceClient client = fixtures.client(b -> b.acknowledged(true));
        for (int i = 0; i < 3; i++) {
            client.log(info("unacknowledged " + i));
        }
        assertTrue(agent.waitForLines(3));
        assertEquals(3, client.stats().unacknowledgedRecords());
        assertFalse(client.flush(Duration.ofMillis(200)), "flush waits for the ACKs in acknowledged mode");
        agent.stop(); // the ACKs never come: the connection is lost
        agent.holdAcks(false);
        agent.start();
        client.log(info("after the restart"));
        return client;
    }

    @Test
    void acknowledgedModeResendsWhatWasNotAcknowledgedUnderTheSameSessionNumbersAndTimes() throws Exception {
        FakeAgent agent = fixtures.agent();
        SluiceClient client = threeUnacknowledgedThenTheAgentRestarts(agent);

        assertTrue(client.flush(Duration.ofSeconds(5)), client.stats().toString());

        List<FakeAgent.Session> sessions = agent.sessions();
        assertEquals(List.of(new FakeAgent.Session(client.session(), 1), new FakeAgent.Session(client.session(), 1)),
                sessions, "the same session, from the first unacknowledged record");
        Map<Long, Set<String>> sendsByNumber = new HashMap<>();
        for (FakeAgent.Numbered line : agent.numbered()) {
            assertEquals(client.session(), line.session());
            sendsByNumber.computeIfAbsent(line.n(), n -> new HashSet<>()).add(line.timeMicros() + " " + line.record());
        }
        assertEquals(Set.of(1L, 2L, 3L, 4L), sendsByNumber.keySet());
        sendsByNumber.values().forEach(sends -> assertEquals(1, sends.size(), "every send of a record is identical"));
        assertEquals(7, agent.numbered().size(), "three of them twice");
        Stats stats = client.stats();
        assertEquals(4, stats.acknowledged());
        assertEquals(7, stats.sent());
        assertEquals(3, stats.resent());
        assertEquals(1, stats.reconnects());
        assertEquals("spooled", stats.ackPoint());
        assertEquals(0, stats.unacknowledgedRecords());
    }

    @Test
    void aNakedRecordKeepsItsPlaceSoResentNumbersStayConsecutive() throws Exception {
        FakeAgent agent = fixtures.agent().nak((n, line) -> line.contains("refuse me") ? "rate_limited" : null);
        agent.holdAcks(true);
        agent.start();
        SluiceClient client = fixtures.client(b -> b.acknowledged(true));
        client.log(info("keep 1"));
        client.log(info("refuse me"));
        client.log(info("keep 2"));
        assertTrue(agent.waitFor(a -> a.numbered().size() == 3, Duration.ofSeconds(5)));
        // The NAK came (and the client heard it), the ACK never did.
        assertTrue(Waiting.until(() -> client.refusedAwaitingAck() == 1, Duration.ofSeconds(5)));
        agent.stop();
        agent.holdAcks(false);
        agent.start();

        assertTrue(client.flush(Duration.ofSeconds(5)), client.stats().toString());

        List<Long> resent = agent.numbered().subList(3, agent.numbered().size()).stream().map(FakeAgent.Numbered::n).toList();
        assertEquals(List.of(1L, 2L, 3L), resent, "the agent numbers the resend as the client does");
        Stats stats = client.stats();
        assertEquals(Map.of("rate_limited", 1L), stats.nak(), "refused twice, counted once");
        assertEquals(2, stats.acknowledged());
    }

    @Test
    void aRefusedRecordSentAgainAfterAReconnectIsCountedByItsLastAnswer() throws Exception {
        // Refused on the first connection, whose covering ACK never came; sent again (the numbers
        // stay consecutive) and taken this time: one row, so it is acknowledged, not a NAK.
        FakeAgent first = fixtures.agent().nak((n, line) -> line.contains("refuse me") ? "rate_limited" : null);
        first.holdAcks(true);
        first.start();
        SluiceClient client = fixtures.client(b -> b.acknowledged(true));
        client.log(info("keep 1"));
        client.log(info("refuse me"));
        client.log(info("keep 2"));
        assertTrue(first.waitFor(a -> a.numbered().size() == 3, Duration.ofSeconds(5)));
        assertTrue(Waiting.until(() -> client.refusedAwaitingAck() == 1, Duration.ofSeconds(5)));
        first.stop();
        fixtures.agent().start(); // the same socket; takes everything

        assertTrue(client.flush(Duration.ofSeconds(5)), client.stats().toString());
        Stats stats = client.stats();
        assertEquals(Map.of(), stats.nak(), "its last answer was an ACK");
        assertEquals(3, stats.acknowledged());
        assertEquals(0, stats.unconfirmed());
    }

    @Test
    void naksAreCountedByReasonAndNeverSentAgainOnTheirOwn() throws Exception {
        FakeAgent agent = fixtures.agent().nak((n, line) -> line.contains("refuse me") ? "rate_limited" : null).start();
        SluiceClient client = fixtures.client(b -> b.acknowledged(true));
        client.log(info("keep 1"));
        client.log(info("refuse me"));
        client.log(info("keep 2"));
        client.log(info("refuse me"));
        assertTrue(client.flush(Duration.ofSeconds(5)));
        assertEquals(Map.of("rate_limited", 2L), client.stats().nak());

        agent.restart();
        client.log(info("keep 3"));
        assertTrue(client.flush(Duration.ofSeconds(5)));

        assertEquals(List.of("keep 1", "keep 2", "keep 3"), agent.messages());
        assertEquals(2, agent.rejected().size(), "NAK'd records are not sent again");
        assertEquals(3, client.stats().acknowledged());
    }

    @Test
    void recordsAwaitingAcknowledgementAreNeverEvictedToMakeRoom() throws Exception {
        FakeAgent agent = fixtures.agent();
        agent.holdAcks(true);
        agent.start();
        SluiceClient client = fixtures.client(b -> b.acknowledged(true).maxQueueRecords(4).dropBelowWarnAt(1.0));
        for (int i = 0; i < 4; i++) {
            client.log(record(Severity.ERROR, "awaiting ack " + i));
        }
        assertTrue(agent.waitForLines(4));

        assertFalse(client.log(record(Severity.FATAL, "no room: sent records still count")));
        assertEquals(4, client.stats().unacknowledgedRecords());
        assertEquals(Map.of("full", Map.of("fatal", 1L)), client.stats().dropped());

        agent.holdAcks(false);
        assertTrue(client.flush(Duration.ofSeconds(5)));
        client.log(record(Severity.ERROR, "room again"));
        assertTrue(client.flush(Duration.ofSeconds(5)));
        assertEquals(List.of("awaiting ack 0", "awaiting ack 1", "awaiting ack 2", "awaiting ack 3", "room again"),
                agent.messages());
        assertTrue(agent.records().stream().anyMatch(r -> "dropped".equals(r.get("sluice.client"))));
    }

    @Test
    void closeIsBoundedWhenTheAgentNeverAnswersTheHandshake() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        agent.stall(); // accepts, never reads: no "OK spooled" comes
        SluiceClient client = fixtures.client(b -> b.acknowledged(true));
        client.log(info("never acknowledged"));
        assertTrue(agent.waitFor(a -> a.connections() == 1, Duration.ofSeconds(5)));

        long started = System.nanoTime();
        client.close(Duration.ofMillis(300));

        assertTrue(System.nanoTime() - started < Duration.ofMillis(1800).toNanos());
        assertEquals(1, client.stats().dropped(DropReason.CLOSED));
    }

    // Visibility. -------------------------------------------------------------------------------

    @Test
    void theCountersAreAnMBeanUntilClose() throws Exception {
        FakeAgent agent = fixtures.agent().start();
        SluiceClient client = fixtures.client(b -> b.maxQueueRecords(2).dropBelowWarnAt(1.0));
        ObjectName name = client.registerMBean("SLUICE-test");
        assertNotNull(name);
        assertEquals(new ObjectName("dev.sluice:type=SluiceClient,name=SLUICE-test"), name);
        agent.stall();
        for (int i = 0; i < 5; i++) {
            client.log(info("r" + i));
        }
        MBeanServer server = ManagementFactory.getPlatformMBeanServer();

        assertEquals(client.stats().droppedTotal(), server.getAttribute(name, "RecordsDropped"));
        assertTrue((Long) server.getAttribute(name, "DroppedFull") >= 1);
        assertEquals(fixtures.socket().toString(), server.getAttribute(name, "SocketPath"));
        assertTrue(server.getAttribute(name, "NakByReason") != null);

        client.close(Duration.ofMillis(100));
        assertFalse(server.isRegistered(name));
    }

    @Test
    void backoffGrowsWithJitterUpToItsCapAndResets() {
        Backoff backoff = new Backoff(20_000_000L, 2_000_000_000L);
        long[] delays = IntStream.range(0, 12).mapToLong(i -> backoff.next()).toArray();

        assertTrue(delays[0] >= 10_000_000L && delays[0] <= 20_000_000L);
        for (long delay : delays) {
            assertTrue(delay <= 2_000_000_000L);
        }
        assertTrue(delays[11] >= 1_000_000_000L);
        backoff.reset();
        assertTrue(backoff.next() <= 20_000_000L);
    }
}
