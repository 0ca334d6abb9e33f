package dev.sluice.bench;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.results.RunResult;
import org.openjdk.jmh.runner.Runner;
import org.openjdk.jmh.runner.format.OutputFormatFactory;
import org.openjdk.jmh.runner.options.Options;
import org.openjdk.jmh.runner.options.OptionsBuilder;
import org.openjdk.jmh.runner.options.TimeValue;
import org.openjdk.jmh.runner.options.VerboseMode;
import org.openjdk.jmh.util.Statistics;

/**
 * Runs {@link LoggingCall} for each variant (one JVM each) and prints one JSON line per variant
 * on stdout; JMH's own output goes to stderr.
 *
 * <pre>
 * java -jar benchmarks.jar [-rate 20000] [-calls 200000] [-warmup 3] [-variants LOGBACK_SLUICE,...]
 * </pre>
 *
 * <p>{@code -calls} sets the measurement's length ({@code calls / rate} seconds), so about that
 * many calls are made; {@code -warmup} is seconds of warm-up at the same pace (one JMH iteration
 * a second). The Sluice appenders use {@code $SLUICE_SOCKET} (else {@code /run/sluice/sluice.sock}).
 * The fields: {@code calls} timed, {@code calls_per_second} reached, the p50/p99/p99.9/max ns of
 * one call (JMH's histogram keeps 10 significant bits: values are rounded down by at most 0.1%),
 * {@code over_1ms} calls, {@code bytes_per_call} allocated by the calling thread (what the call
 * itself allocates), {@code bytes_per_call_all_threads} allocated by the whole JVM in the same
 * window (the appenders' and frameworks' own threads too: the garbage logging makes), {@code
 * gc_count} collections during the measurement, and for the Sluice appenders {@code dropped},
 * {@code sent} and {@code connected} (the measurement's, after waiting up to 2 s for the appender
 * to write what it holds).
 */
public final class Main {
    private static final String USAGE =
            "usage: java -jar benchmarks.jar [-rate CALLS_PER_SECOND] [-calls N] [-warmup SECONDS] [-variants A,B,...]\n"
            + "variants: " + String.join(",", Stream.of(Variant.values()).map(Enum::name).toList());

    private Main() {}

    public static void main(String[] args) throws Exception {
        int rate = 20_000;
        long calls = 200_000;
        int warmupSeconds = 3;
        List<Variant> variants = new ArrayList<>(List.of(Variant.values()));
        try {
            for (int i = 0; i < args.length; i++) {
                switch (args[i]) {
                    case "-rate" -> rate = Integer.parseInt(value(args, ++i));
                    case "-calls" -> calls = Long.parseLong(value(args, ++i));
                    case "-warmup" -> warmupSeconds = Integer.parseInt(value(args, ++i));
                    case "-variants" -> {
                        variants.clear();
                        for (String name : value(args, ++i).split(",")) {
                            variants.add(Variant.valueOf(name.trim().toUpperCase(Locale.ROOT)));
                        }
                    }
                    case "-h", "-help", "--help" -> {
                        System.out.println(USAGE);
                        return;
                    }
                    default -> throw new IllegalArgumentException("unknown argument: " + args[i]);
                }
            }
            if (rate <= 0 || calls <= 0 || warmupSeconds < 0 || variants.isEmpty()) {
                throw new IllegalArgumentException("-rate and -calls must be positive, -warmup not negative");
            }
        } catch (IllegalArgumentException e) { // NumberFormatException too
            System.err.println(e.getMessage() + "\n" + USAGE);
            System.exit(2);
            return;
        }

        Path reports = Files.createTempDirectory("sluice-bench-");
        try {
            // A whole number of the pacing's groups (LoggingCall makes exactly that many calls).
            long groups = (calls + LoggingCall.GROUP - 1) / LoggingCall.GROUP;
            long measureNanos = groups * LoggingCall.groupNanos(rate);
            Options options = new OptionsBuilder()
                    .include("^" + Pattern.quote(LoggingCall.class.getName() + ".call") + "$")
                    .param("variant", variants.stream().map(Enum::name).toArray(String[]::new))
                    .param("rate", Integer.toString(rate))
                    .mode(Mode.SampleTime)
                    .timeUnit(TimeUnit.NANOSECONDS)
                    .threads(1)
                    .forks(1)
                    .warmupIterations(warmupSeconds)
                    .warmupTime(TimeValue.seconds(1))
                    .measurementIterations(1)
                    .measurementTime(measureNanos % 1_000_000 == 0
                            ? TimeValue.milliseconds(measureNanos / 1_000_000) : TimeValue.nanoseconds(measureNanos))
                    // The same heap for every variant; the JVM options given to this JVM come after and win.
                    .jvmArgsPrepend("-Xms1g", "-Xmx1g")
                    .jvmArgsAppend("-D" + LoggingCall.REPORT_DIR + "=" + reports)
                    .shouldFailOnError(true)
                    .build();
            Collection<RunResult> results =
                    new Runner(options, OutputFormatFactory.createFormatInstance(System.err, VerboseMode.NORMAL)).run();
            List<RunResult> ordered = new ArrayList<>(results);
            ordered.sort(Comparator.comparing(r -> Variant.valueOf(r.getParams().getParam("variant"))));
            for (RunResult result : ordered) {
                Variant variant = Variant.valueOf(result.getParams().getParam("variant"));
                System.out.println(json(line(variant, result, read(reports.resolve(variant.name() + ".properties")))));
            }
            System.out.flush();
        } finally {
            try (Stream<Path> files = Files.list(reports)) {
                for (Path file : (Iterable<Path>) files::iterator) {
                    Files.deleteIfExists(file);
                }
            }
            Files.deleteIfExists(reports);
        }
    }

    private static String value(String[] args, int i) {
        if (i >= args.length) {
            throw new IllegalArgumentException(args[i - 1] + " needs a value");
        }
        return args[i];
    }

    private static Properties read(Path file) throws IOException {
        Properties report = new Properties();
        if (!Files.exists(file)) {
            throw new IllegalStateException("the fork wrote no report (" + file + ")");
        }
        try (InputStream in = Files.newInputStream(file)) {
            report.load(in);
        }
        return report;
    }

    /** The variant's figures, in the order of the other clients' lines. */
    static Map<String, Object> line(Variant variant, RunResult result, Properties report) {
        Statistics timings = result.getPrimaryResult().getStatistics(); // ns per call
        long overOneMilli = 0;
        for (Iterator<Map.Entry<Double, Long>> it = timings.getRawData(); it.hasNext(); ) {
            Map.Entry<Double, Long> bucket = it.next();
            if (bucket.getKey() > 1_000_000.0) {
                overOneMilli += bucket.getValue();
            }
        }
        long callsMade = Long.parseLong(report.getProperty("calls"));
        long nanos = Long.parseLong(report.getProperty("nanos"));
        long jmhBytes = jmhBytes(timings, Long.parseLong(report.getProperty("sample_buffer_bytes")),
                Long.parseLong(report.getProperty("histogram_bucket_bytes")));
        long callerBytes = Long.parseLong(report.getProperty("caller_bytes")) - jmhBytes;
        long allThreadsBytes = Long.parseLong(report.getProperty("all_threads_bytes")) - jmhBytes;

        Map<String, Object> line = new LinkedHashMap<>();
        line.put("client", "java");
        line.put("variant", variant.label);
        line.put("calls", timings.getN());
        if (timings.getN() != callsMade) { // above 20,000 calls a second JMH times a sample
            line.put("calls_made", callsMade);
        }
        line.put("calls_per_second", nanos > 0 ? Math.round(callsMade * 1e9 / nanos) : 0);
        line.put("p50_ns", Math.round(timings.getPercentile(50.0)));
        line.put("p99_ns", Math.round(timings.getPercentile(99.0)));
        line.put("p999_ns", Math.round(timings.getPercentile(99.9)));
        line.put("max_ns", Math.round(timings.getMax()));
        line.put("over_1ms", overOneMilli);
        line.put("bytes_per_call", oneDecimal(callsMade > 0 ? (double) callerBytes / callsMade : Double.NaN));
        line.put("bytes_per_call_all_threads", oneDecimal(callsMade > 0 ? (double) allThreadsBytes / callsMade : Double.NaN));
        line.put("gc_count", Long.parseLong(report.getProperty("gc_count")));
        if (variant.sluice) {
            line.put("dropped", Long.parseLong(report.getProperty("dropped")));
            line.put("sent", Long.parseLong(report.getProperty("sent")));
            line.put("connected", Boolean.parseBoolean(report.getProperty("connected")));
        }
        return line;
    }

    /**
     * What JMH allocated on the measuring thread during the (one) measurement iteration: its
     * SampleBuffer, and an {@code int[1024]} for each of the buffer's buckets a timing fell in
     * (bucket {@code max(0, bit length - 10)}; JMH 1.37's {@code SampleBuffer.add}).
     */
    static long jmhBytes(Statistics timings, long sampleBufferBytes, long bucketBytes) {
        java.util.BitSet buckets = new java.util.BitSet();
        for (Iterator<Map.Entry<Double, Long>> it = timings.getRawData(); it.hasNext(); ) {
            long nanos = Math.round(it.next().getKey());
            buckets.set(Math.max(0, Long.SIZE - Long.numberOfLeadingZeros(nanos) - 10));
        }
        return sampleBufferBytes + buckets.cardinality() * bucketBytes;
    }

    /** A number JSON can carry, to one decimal (NaN and the infinities as null). */
    private static Object oneDecimal(double value) {
        if (Double.isNaN(value) || Double.isInfinite(value)) {
            return null;
        }
        return new JsonNumber(String.format(Locale.ROOT, "%.1f", value));
    }

    private record JsonNumber(String text) {}

    /** One JSON object on one line; values are strings, numbers, booleans or null. */
    static String json(Map<String, Object> fields) {
        StringBuilder out = new StringBuilder("{");
        for (Map.Entry<String, Object> field : fields.entrySet()) {
            if (out.length() > 1) {
                out.append(',');
            }
            string(out, field.getKey()).append(':');
            Object value = field.getValue();
            if (value == null) {
                out.append("null");
            } else if (value instanceof String text) {
                string(out, text);
            } else if (value instanceof JsonNumber number) {
                out.append(number.text());
            } else {
                out.append(value); // Long, Integer, Boolean
            }
        }
        return out.append('}').toString();
    }

    private static StringBuilder string(StringBuilder out, String text) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"');
    }
}
