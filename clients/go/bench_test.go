package sluice

// Benchmarks of the logging call: slog through this package's handler with the agent up (the
// in-process fake agent, reading and discarding) and absent, the same through the Writer, and the
// anchor — slog's own JSONHandler writing to a bufio.Writer over a file. Each reports allocations
// and, timing every call of a sample on its own, the p50/p99/p99.9 ns per call and how many calls
// took over 1 ms (the tail is what a request handler feels).
//
// Run them on a quiet machine; `go test -run '^$' -bench . -benchtime=100x` only checks they work.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"testing"
	"time"
)

// maxSamples bounds the calls timed one by one (8 MiB of durations).
const maxSamples = 1 << 20

// benchCalls runs call b.N times, timing each of the first maxSamples, and reports the
// distribution.
func benchCalls(b *testing.B, call func(i int)) {
	samples := make([]time.Duration, 0, min(b.N, maxSamples))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(samples) < cap(samples) {
			started := time.Now()
			call(i)
			samples = append(samples, time.Since(started))
			continue
		}
		call(i)
	}
	b.StopTimer()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	quantile := func(q float64) float64 {
		return float64(samples[min(len(samples)-1, int(q*float64(len(samples))))].Nanoseconds())
	}
	slow := len(samples) - sort.Search(len(samples), func(i int) bool { return samples[i] > time.Millisecond })
	b.ReportMetric(quantile(0.50), "p50-ns/call")
	b.ReportMetric(quantile(0.99), "p99-ns/call")
	b.ReportMetric(quantile(0.999), "p99.9-ns/call")
	b.ReportMetric(float64(slow), "calls>1ms")
}

// logRequest is the call measured: a typical access log line.
func logRequest(log *slog.Logger, i int) {
	log.Info("request served", "method", "GET", "path", "/api/orders/17", "status", 200,
		"duration", 1234*time.Microsecond, "user", "ada", "i", i)
}

// benchClient is a client on a fresh socket, with a fake agent that discards what it reads if up.
func benchClient(b *testing.B, up bool) *Client {
	path := socketPath(b)
	if up {
		agent := newFakeAgent(b, path)
		agent.discard = true
		if err := agent.start(); err != nil {
			b.Fatal(err)
		}
	}
	return newClient(b, path)
}

// reportDrops says what share of the calls the queue dropped (the agent up should keep up).
func reportDrops(b *testing.B, c *Client) {
	b.ReportMetric(float64(c.Stats().DroppedTotal)/float64(b.N), "dropped/call")
}

func BenchmarkSlogSluiceHandlerAgentUp(b *testing.B) {
	c := benchClient(b, true)
	log := slog.New(c.Handler(&HandlerOptions{Logger: "bench"}))
	benchCalls(b, func(i int) { logRequest(log, i) })
	reportDrops(b, c)
}

func BenchmarkSlogSluiceHandlerAgentAbsent(b *testing.B) {
	c := benchClient(b, false)
	log := slog.New(c.Handler(&HandlerOptions{Logger: "bench"}))
	benchCalls(b, func(i int) { logRequest(log, i) })
	reportDrops(b, c)
}

func BenchmarkWriterJSONLineAgentUp(b *testing.B) {
	c := benchClient(b, true)
	w := c.Writer()
	line := []byte(`{"level":"info","ts":1767225600.123456,"caller":"shop/pay.go:42","msg":"request served","method":"GET","path":"/api/orders/17","status":200}` + "\n")
	benchCalls(b, func(int) { w.Write(line) })
	reportDrops(b, c)
}

// The anchor: slog's JSON handler into a buffered file, the cheapest way to write JSON lines.
func BenchmarkSlogJSONHandlerBufferedFile(b *testing.B) {
	file, err := os.Create(filepath.Join(b.TempDir(), "log.json"))
	if err != nil {
		b.Fatal(err)
	}
	defer file.Close()
	buffered := bufio.NewWriter(file)
	log := slog.New(slog.NewJSONHandler(buffered, nil))
	benchCalls(b, func(i int) { logRequest(log, i) })
	if err := buffered.Flush(); err != nil {
		b.Fatal(fmt.Errorf("flush: %w", err))
	}
}

// BenchmarkLoggingCall is the run scripts/bench-clients makes (SLUICE_BENCH_JSON=1): the handler
// on the agent at $SLUICE_SOCKET — up, stopped or without Kafka, as the script arranged — beside
// the anchor, paced to $SLUICE_BENCH_RATE calls a second (groups of 100), each printing one JSON
// line: the call's p50/p99/p99.9/max ns, calls over 1 ms, allocations per call.
func BenchmarkLoggingCall(b *testing.B) {
	if os.Getenv("SLUICE_BENCH_JSON") != "1" {
		b.Skip("scripts/bench-clients runs it (SLUICE_BENCH_JSON=1, SLUICE_SOCKET)")
	}
	rate := 20000
	if value, err := strconv.Atoi(os.Getenv("SLUICE_BENCH_RATE")); err == nil && value > 0 {
		rate = value
	}
	b.Run("sluice", func(b *testing.B) {
		c, err := New(os.Getenv(SocketEnv))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close(context.Background())
		log := slog.New(c.Handler(&HandlerOptions{Logger: "bench"}))
		for i := 0; i < 1000; i++ { // warm up: the sender dialled, buffers pooled
			logRequest(log, i)
		}
		_ = c.Flush(context.Background())
		extra := pacedCalls(b, rate, func(i int) { logRequest(log, i) })
		_ = c.Flush(context.Background())
		stats := c.Stats()
		extra["sent"], extra["dropped"], extra["connected"] = stats.Sent, stats.DroppedTotal, stats.Connected
		printResult(b, "slog + sluice Handler", extra)
	})
	b.Run("anchor", func(b *testing.B) {
		file, err := os.Create(filepath.Join(b.TempDir(), "log.json"))
		if err != nil {
			b.Fatal(err)
		}
		defer file.Close()
		buffered := bufio.NewWriter(file)
		log := slog.New(slog.NewJSONHandler(buffered, nil))
		extra := pacedCalls(b, rate, func(i int) { logRequest(log, i) })
		_ = buffered.Flush()
		printResult(b, "slog.NewJSONHandler -> bufio file (anchor)", extra)
	})
}

// pacedCalls times each of b.N calls, pacing them to rate a second; the figures of the run.
func pacedCalls(b *testing.B, rate int, call func(i int)) map[string]any {
	samples := make([]time.Duration, b.N)
	interval := time.Duration(100 * int64(time.Second) / int64(rate))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	started := time.Now()
	next := started
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		call(i)
		samples[i] = time.Since(t)
		if i%100 == 99 {
			next = next.Add(interval)
			if pause := time.Until(next); pause > 0 {
				time.Sleep(pause)
			}
		}
	}
	b.StopTimer()
	elapsed := time.Since(started)
	runtime.ReadMemStats(&after)
	slow := 0
	for _, d := range samples {
		if d > time.Millisecond {
			slow++
		}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	at := func(q float64) int64 { return samples[min(len(samples)-1, int(q*float64(len(samples))))].Nanoseconds() }
	return map[string]any{
		"calls": b.N, "calls_per_second": int(float64(b.N) / elapsed.Seconds()),
		"p50_ns": at(0.50), "p99_ns": at(0.99), "p999_ns": at(0.999), "max_ns": samples[len(samples)-1].Nanoseconds(),
		"over_1ms": slow, "allocs_per_call": float64(after.Mallocs-before.Mallocs) / float64(b.N),
	}
}

// printResult prints the run's JSON line (not for the N=1 probe run `go test` makes first).
func printResult(b *testing.B, variant string, figures map[string]any) {
	if b.N < 2 {
		return
	}
	figures["client"], figures["variant"] = "go", variant
	line, err := json.Marshal(figures)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Println(string(line))
}
