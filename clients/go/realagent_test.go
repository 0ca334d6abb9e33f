package sluice

// The real agent (SLUICE_BIN) as a child process, for the tests that run the client against it.
//
// Owns: writing the agent's TOML config (one lines listener on the test's socket, the admin
// server on a loopback port the kernel picks and writes to admin_address_file, the brokers from
// SLUICE_TEST_KAFKA and a topic no other run uses — the stack's broker creates it on first use),
// starting it and waiting for /readyz, stopping it (SIGTERM and wait; SIGKILL where a test means
// it), and reading its Prometheus metrics.
//
// Must not: start anything but the agent, listen beyond loopback, or leave a process running
// (every agent is stopped by t.Cleanup).

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	// readyTimeout: how long an agent may take to answer /readyz with "ready".
	readyTimeout = 30 * time.Second
	// stopTimeout: how long a SIGTERM'd agent may drain (its drain_timeout is 5 s) before SIGKILL.
	stopTimeout = 15 * time.Second
)

// Metric names (docs/METRICS.md).
const (
	metricIngested      = "sluice_ingest_records_total"
	metricRejected      = "sluice_ingest_records_rejected_total"
	metricDelivered     = "sluice_ship_records_delivered_total"
	metricRecovered     = "sluice_spool_recovered_records_total"
	metricBufferDropped = "sluice_buffer_records_dropped_total"
	metricFailed        = "sluice_ship_records_failed_total"
)

var topicCounter atomic.Int64

// loopback reaches the admin server directly, never through a proxy the environment names.
var loopback = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 5 * time.Second}

type realAgentOptions struct {
	buffer        string // "memory" (default) or "disk"
	ackPoint      string // "spooled" or "delivered"; default the agent's
	maxRecordSize string // "64 KiB"; default the agent's
}

// realAgent is one agent config (socket, spool, topic) in a directory; started and stopped as
// often as a test likes, always on the same socket and spool.
type realAgent struct {
	t         testing.TB
	binary    string
	dir       string
	socket    string
	topic     string
	config    string
	adminFile string
	logPath   string
	admin     string
	starts    int
	cmd       *exec.Cmd
	exited    chan struct{} // closed when the current process has been waited for
}

// newRealAgent writes the config of an agent on socket; the test is skipped without SLUICE_BIN
// and SLUICE_TEST_KAFKA. Whatever the test does, the agent is stopped when it ends.
func newRealAgent(t testing.TB, socket string, opts realAgentOptions) *realAgent {
	t.Helper()
	binary := os.Getenv("SLUICE_BIN")
	if binary == "" {
		t.Skip("SLUICE_BIN is not set: the path of a built `sluice` binary runs these tests")
	}
	brokers := os.Getenv("SLUICE_TEST_KAFKA")
	if brokers == "" {
		t.Skip("SLUICE_TEST_KAFKA is not set: a Kafka bootstrap address (`scripts/stack env`)")
	}
	dir := filepath.Dir(socket)
	a := &realAgent{
		t:         t,
		binary:    binary,
		dir:       dir,
		socket:    socket,
		topic:     fmt.Sprintf("goclient_%d_%d_%d", os.Getpid(), topicCounter.Add(1), time.Now().UnixNano()%1_000_000_000),
		config:    filepath.Join(dir, "agent.toml"),
		adminFile: filepath.Join(dir, "agent.admin"),
		logPath:   filepath.Join(dir, "agent.log"),
	}
	lines := []string{
		"[log]", `level = "info,librdkafka=warn"`, `format = "json"`,
		"[kafka]", fmt.Sprintf("brokers = %q", brokers), fmt.Sprintf("topic = %q", a.topic),
		"[agent]", `admin_listen = "127.0.0.1:0"`, fmt.Sprintf("admin_address_file = %q", a.adminFile), `drain_timeout = "5s"`,
		"[ingest]",
	}
	if opts.ackPoint != "" {
		lines = append(lines, fmt.Sprintf("ack_point = %q", opts.ackPoint))
	}
	lines = append(lines, "[ingest.listeners.default]", `protocol = "lines"`, fmt.Sprintf("socket = %q", socket))
	if opts.maxRecordSize != "" {
		lines = append(lines, fmt.Sprintf("max_record_size = %q", opts.maxRecordSize))
	}
	if opts.buffer == "" {
		opts.buffer = "memory"
	}
	lines = append(lines, "[buffer]", fmt.Sprintf("type = %q", opts.buffer))
	if opts.buffer == "disk" {
		lines = append(lines, fmt.Sprintf("path = %q", filepath.Join(dir, "spool")), `fsync = "10ms"`)
	}
	if err := os.WriteFile(a.config, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if a.running() {
			a.terminate()
		}
	})
	return a
}

// start starts the agent and waits until /readyz answers 200 "ready" (Kafka answered).
func (a *realAgent) start() {
	a.t.Helper()
	if a.running() {
		a.t.Fatal("the agent is already running")
	}
	os.Remove(a.adminFile) // a restart binds another port: wait for the new one
	a.starts++
	log, err := os.OpenFile(a.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		a.t.Fatal(err)
	}
	defer log.Close()
	fmt.Fprintf(log, "--- start %d\n", a.starts)
	cmd := exec.Command(a.binary, "agent", "--config", a.config)
	cmd.Dir, cmd.Stdout, cmd.Stderr = a.dir, log, log
	if err := cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.cmd, a.admin = cmd, ""
	exited := make(chan struct{})
	a.exited = exited
	go func() {
		cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		if !a.running() {
			a.t.Fatalf("the agent exited (%v); log:\n%s", cmd.ProcessState, a.logTail())
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("the agent was not ready in time; log:\n%s", a.logTail())
		}
		if a.admin == "" {
			if address, err := os.ReadFile(a.adminFile); err == nil {
				a.admin = strings.TrimSpace(string(address))
			}
		}
		if a.admin != "" {
			if status, body := a.get("/readyz"); status == 200 && strings.TrimSpace(body) == "ready" {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *realAgent) running() bool {
	if a.exited == nil {
		return false
	}
	select {
	case <-a.exited:
		return false
	default:
		return true
	}
}

// terminate sends SIGTERM and waits for the drain to end (SIGKILL if it outlives stopTimeout); it
// returns the exit code.
func (a *realAgent) terminate() int {
	if a.running() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.exited:
		case <-time.After(stopTimeout):
			a.cmd.Process.Kill()
			<-a.exited
		}
	}
	return a.cmd.ProcessState.ExitCode()
}

// freeze sends SIGSTOP: the agent reads and answers nothing until it is killed, so what a client
// writes from then on waits for its acknowledgement, however quick the agent was.
func (a *realAgent) freeze() {
	if a.running() {
		a.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (a *realAgent) kill() {
	if a.running() {
		a.cmd.Process.Kill()
		<-a.exited
	}
}

// metrics is one scrape of /metrics: every sample's value by name, each series by its labels.
type metrics map[string]map[string]float64

func (m metrics) total(name string) float64 {
	var sum float64
	for _, value := range m[name] {
		sum += value
	}
	return sum
}

// lost is every counter of records the agent refused, dropped or gave up, that is not zero.
func (m metrics) lost() map[string]map[string]float64 {
	lost := map[string]map[string]float64{}
	for _, name := range []string{metricRejected, metricBufferDropped, metricFailed} {
		for labels, value := range m[name] {
			if value != 0 {
				if lost[name] == nil {
					lost[name] = map[string]float64{}
				}
				lost[name][labels] = value
			}
		}
	}
	return lost
}

func (a *realAgent) metrics() metrics {
	a.t.Helper()
	status, body := a.get("/metrics")
	if status != 200 {
		a.t.Fatalf("/metrics answered %d: %.200s", status, body)
	}
	m := metrics{}
	scanner := bufio.NewScanner(strings.NewReader(body))
	for scanner.Scan() {
		line := scanner.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		space := strings.LastIndexByte(line, ' ')
		if space < 0 {
			continue
		}
		value, err := strconv.ParseFloat(line[space+1:], 64)
		if err != nil {
			continue
		}
		name, labels, _ := strings.Cut(line[:space], "{")
		if m[name] == nil {
			m[name] = map[string]float64{}
		}
		m[name][strings.TrimSuffix(labels, "}")] = value
	}
	return m
}

// waitForMetrics scrapes until cond holds or timeout passes; it returns the last scrape (check
// it again to see why it did not hold).
func (a *realAgent) waitForMetrics(cond func(metrics) bool, timeout time.Duration) metrics {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := a.metrics()
		if cond(m) || time.Now().After(deadline) {
			return m
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (a *realAgent) logTail() string {
	data, err := os.ReadFile(a.logPath)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

func (a *realAgent) get(path string) (int, string) {
	response, err := loopback.Get("http://" + a.admin + path)
	if err != nil { // not listening yet, or gone
		return 0, err.Error()
	}
	defer response.Body.Close()
	body, _ := io.ReadAll(response.Body)
	return response.StatusCode, string(body)
}
