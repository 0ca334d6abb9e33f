package dev.sluice.otlptest;

import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.api.logs.Logger;
import io.opentelemetry.api.logs.Severity;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.TraceFlags;
import io.opentelemetry.api.trace.TraceState;
import io.opentelemetry.context.Context;
import io.opentelemetry.exporter.otlp.http.logs.OtlpHttpLogRecordExporter;
import io.opentelemetry.exporter.otlp.logs.OtlpGrpcLogRecordExporter;
import io.opentelemetry.sdk.common.CompletableResultCode;
import io.opentelemetry.sdk.logs.SdkLoggerProvider;
import io.opentelemetry.sdk.logs.export.BatchLogRecordProcessor;
import io.opentelemetry.sdk.logs.export.LogRecordExporter;
import io.opentelemetry.sdk.resources.Resource;
import java.util.concurrent.TimeUnit;

/**
 * Sends log records to a Sluice agent with the stock OpenTelemetry Java SDK.
 *
 * <p>Usage: {@code Export grpc|http ENDPOINT COUNT}. ENDPOINT is {@code http://127.0.0.1:4317}
 * (gRPC) or {@code http://127.0.0.1:4318/v1/logs} (HTTP). Record i is "java otlp i" at INFO with
 * the attribute n=i, in the trace 0af7651916cd43dd8448eb211c80319c. Prints "flushed" when the
 * SDK's flush succeeded; exits 1 otherwise.
 */
public final class Export {
  private Export() {}

  public static void main(String[] args) {
    String kind = args[0];
    String endpoint = args[1];
    int count = Integer.parseInt(args[2]);
    LogRecordExporter exporter =
        kind.equals("grpc")
            ? OtlpGrpcLogRecordExporter.builder().setEndpoint(endpoint).build()
            : OtlpHttpLogRecordExporter.builder().setEndpoint(endpoint).build();
    SdkLoggerProvider provider =
        SdkLoggerProvider.builder()
            .setResource(
                Resource.getDefault().merge(Resource.create(Attributes.of(AttributeKey.stringKey("service.name"), "otlp-java"))))
            .addLogRecordProcessor(BatchLogRecordProcessor.builder(exporter).build())
            .build();
    Logger logger = provider.get("otlp-java");
    SpanContext span =
        SpanContext.create(
            "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", TraceFlags.getSampled(), TraceState.getDefault());
    Context context = Context.root().with(Span.wrap(span));
    for (int n = 0; n < count; n++) {
      logger
          .logRecordBuilder()
          .setContext(context)
          .setSeverity(Severity.INFO)
          .setSeverityText("INFO")
          .setBody("java otlp " + n)
          .setAttribute(AttributeKey.longKey("n"), (long) n)
          .emit();
    }
    CompletableResultCode flushed = provider.forceFlush().join(30, TimeUnit.SECONDS);
    provider.shutdown().join(10, TimeUnit.SECONDS);
    if (!flushed.isSuccess()) {
      System.out.println("flush failed");
      System.exit(1);
    }
    System.out.println("flushed");
  }
}
