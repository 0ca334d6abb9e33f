// Prints a line, a real JVM stack trace (an exception with a cause, as a logger writes it after
// its message), and a line: the multiline test (tests/it/multiline.rs) sends this output to a
// `lines` listener with `preset = "java"`. Run as `java Trace.java`.
public class Trace {
  static void query() throws java.io.IOException {
    throw new java.io.IOException("connection reset");
  }

  static void handle() {
    try {
      query();
    } catch (java.io.IOException e) {
      throw new IllegalStateException("request failed", e);
    }
  }

  public static void main(String[] args) {
    System.out.println("2026-12-06 12:00:00 INFO java before");
    try {
      handle();
    } catch (IllegalStateException e) {
      System.out.println("2026-12-06 12:00:01 ERROR java failed");
      e.printStackTrace(System.out);
    }
    System.out.println("2026-12-06 12:00:02 INFO java after");
  }
}
