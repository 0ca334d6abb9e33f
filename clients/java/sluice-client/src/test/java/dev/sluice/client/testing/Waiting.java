package dev.sluice.client.testing;

import java.time.Duration;
import java.util.function.BooleanSupplier;

/** Waiting in tests: poll a condition until it holds or a timeout passes (a hang fails, never blocks). */
public final class Waiting {
    private Waiting() {}

    /** True once {@code condition} holds; false if {@code timeout} passes first. */
    public static boolean until(BooleanSupplier condition, Duration timeout) {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                return false;
            }
            try {
                Thread.sleep(10);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return condition.getAsBoolean();
            }
        }
        return true;
    }

    /** {@link #until} with 5 seconds. */
    public static boolean until(BooleanSupplier condition) {
        return until(condition, Duration.ofSeconds(5));
    }
}
