package dev.sluice.client;

import java.security.SecureRandom;

/**
 * The client session's id ({@code SLUICE/2 ACK session=…}): a UUIDv7 (RFC 9562: Unix
 * milliseconds, then random bits) as 32 lower-case hex digits, drawn once per client. Every
 * record's id in the store is derived from it and the record's number, so it must not repeat.
 */
final class SessionId {
    private static final SecureRandom RANDOM = new SecureRandom();
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private SessionId() {}

    static String next() {
        byte[] bytes = new byte[16];
        RANDOM.nextBytes(bytes);
        long millis = System.currentTimeMillis();
        for (int i = 0; i < 6; i++) {
            bytes[i] = (byte) (millis >>> (8 * (5 - i)));
        }
        bytes[6] = (byte) ((bytes[6] & 0x0F) | 0x70); // version 7
        bytes[8] = (byte) ((bytes[8] & 0x3F) | 0x80); // variant 10
        char[] out = new char[32];
        for (int i = 0; i < 16; i++) {
            out[2 * i] = HEX[(bytes[i] >> 4) & 0xF];
            out[2 * i + 1] = HEX[bytes[i] & 0xF];
        }
        return new String(out);
    }
}
