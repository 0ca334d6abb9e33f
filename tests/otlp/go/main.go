// Command otlp-go sends log records to a Sluice agent with the stock OpenTelemetry Go SDK
// (go.opentelemetry.io/otel/sdk/log and the otlploggrpc exporter), as an app would: the
// integration tests (tests/it/otlp.rs) run it against the real agent.
//
// Usage: otlp-go ENDPOINT COUNT [BODY_BYTES]
//
// ENDPOINT is a gRPC target: "unix:///run/sluice/otlp.sock" or "127.0.0.1:4317". Each record
// i has the body "go otlp i", the attribute n=i and a fixed trace context; BODY_BYTES pads
// the body to that size. Every error the SDK reports (a partial success among them) is
// printed as a line "error: ...".
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: otlp-go ENDPOINT COUNT [BODY_BYTES]")
		os.Exit(2)
	}
	endpoint := os.Args[1]
	count, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "COUNT:", err)
		os.Exit(2)
	}
	pad := 0
	if len(os.Args) > 3 {
		pad, _ = strconv.Atoi(os.Args[3])
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { fmt.Println("error:", err) }))
	ctx := context.Background()
	exporter, err := otlploggrpc.New(ctx, otlploggrpc.WithEndpoint(endpoint), otlploggrpc.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, "exporter:", err)
		os.Exit(1)
	}
	provider := sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(exporter)))
	logger := provider.Logger("otlp-go")
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	spanCtx := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))
	for i := 0; i < count; i++ {
		var record otellog.Record
		body := fmt.Sprintf("go otlp %d", i)
		if len(body) < pad {
			body += strings.Repeat("x", pad-len(body))
		}
		record.SetTimestamp(time.Now())
		record.SetSeverity(otellog.SeverityInfo)
		record.SetSeverityText("INFO")
		record.SetBody(attribute.StringValue(body))
		record.AddAttributes(attribute.Int("n", i))
		logger.Emit(spanCtx, record)
	}
	flushCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := provider.ForceFlush(flushCtx); err != nil {
		fmt.Println("error: flush:", err)
	}
	if err := provider.Shutdown(flushCtx); err != nil {
		fmt.Println("error: shutdown:", err)
	}
	fmt.Println("done")
}
