package sluice

// What a record looks like when it reaches the agent.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/slogtest"
	"time"
)

type cardError struct{ code string }

func (e *cardError) Error() string { return "card declined: " + e.code }

type panicky struct{}

func (panicky) String() string { panic("no") }

func TestRecordsArriveAsJSONWithAttrsGroupsAndWholeErrorChains(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	log := newLogger(c, &HandlerOptions{Logger: "shop", Fields: map[string]any{"service": "checkout", "version": 3}})

	log.With("user", "ada").WithGroup("order").Info("paid order 17",
		"id", 17, "amount", 12.5, "items", []int{1, 2}, slog.Group("card", "brand", "visa"))
	root := &cardError{code: "51"}
	err := fmt.Errorf("pay order 17: %w", errors.Join(root, errors.New("retry budget spent")))
	log.Error("checkout broke", "err", err, "took", 1500*time.Millisecond)
	flush(t, c, 5*time.Second)

	records := agent.expect(t, 2)
	first, second := records[0], records[1]
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`).MatchString(first["time"].(string)) {
		t.Errorf("time %q is not RFC 3339 UTC with microseconds", first["time"])
	}
	want := map[string]any{
		"level": "info", "logger": "shop", "message": "paid order 17", "process": float64(os.Getpid()),
		"service": "checkout", "version": float64(3), "user": "ada",
	}
	for key, value := range want {
		if first[key] != value {
			t.Errorf("%s = %v, want %v", key, first[key], value)
		}
	}
	order := first["order"].(map[string]any)
	if order["id"] != float64(17) || order["amount"] != 12.5 || fmt.Sprint(order["items"]) != "[1 2]" ||
		order["card"].(map[string]any)["brand"] != "visa" {
		t.Errorf("the group holds %v", order)
	}

	if second["level"] != "error" || second["took"] != "1.5s" {
		t.Errorf("level %v, took %v", second["level"], second["took"])
	}
	rendered := second["err"].(map[string]any)
	if rendered["message"] != err.Error() || rendered["type"] != "*fmt.wrapError" {
		t.Errorf("err is %v", rendered)
	}
	var chain []string
	for _, link := range rendered["chain"].([]any) {
		link := link.(map[string]any)
		chain = append(chain, link["type"].(string)+": "+link["message"].(string))
	}
	wantChain := []string{
		"*errors.joinError: card declined: 51\nretry budget spent",
		"*sluice.cardError: card declined: 51",
		"*errors.errorString: retry budget spent",
	}
	if strings.Join(chain, "|") != strings.Join(wantChain, "|") {
		t.Errorf("chain\n%q\nwant\n%q", chain, wantChain)
	}
}

func TestAttrsNamedLikeTheRecordsOwnFieldsAreKeptUnderTheExtraPrefix(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	newLogger(c, nil).With("time", 3).Warn("hello", "level", "mine", slog.Group("g", "level", "nested is fine"))
	flush(t, c, 5*time.Second)

	record := agent.expect(t, 1)[0]
	if record["level"] != "warn" || record["extra.level"] != "mine" || record["extra.time"] != float64(3) {
		t.Errorf("record %v", record)
	}
	if record["g"].(map[string]any)["level"] != "nested is fine" {
		t.Errorf("a group's keys are its own: %v", record["g"])
	}
}

type traceKey struct{}

func TestTraceAndSpanIDsAreWrittenAtTheTopWhereverTheyWereGiven(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	log := newLogger(c, &HandlerOptions{ContextAttrs: func(ctx context.Context) []slog.Attr {
		if ids, ok := ctx.Value(traceKey{}).([2]string); ok {
			return []slog.Attr{slog.String("trace_id", ids[0]), slog.String("span_id", ids[1]), slog.String("request", "r-1")}
		}
		return nil
	}})
	ctx := context.WithValue(context.Background(), traceKey{}, [2]string{"0af7651916cd43dd8448eb211c80319c", "00f067aa0ba902b7"})

	log.InfoContext(ctx, "from the context")
	log.WithGroup("http").Info("from a group", "trace_id", "11111111111111111111111111111111", "status", 200)
	log.With("span_id", "2222222222222222").InfoContext(ctx, "WithAttrs wins over the context")
	log.Info("none")
	flush(t, c, 5*time.Second)

	records := agent.expect(t, 4)
	if r := records[0]; r["trace_id"] != "0af7651916cd43dd8448eb211c80319c" || r["span_id"] != "00f067aa0ba902b7" || r["request"] != "r-1" {
		t.Errorf("from the context: %v", r)
	}
	if r := records[1]; r["trace_id"] != "11111111111111111111111111111111" || r["http"].(map[string]any)["status"] != float64(200) {
		t.Errorf("from a group: %v", r)
	}
	if r := records[2]; r["span_id"] != "2222222222222222" || r["trace_id"] != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("WithAttrs: %v", r)
	}
	if _, ok := records[3]["trace_id"]; ok {
		t.Errorf("no ids, no field: %v", records[3])
	}
}

func TestValuesJSONCannotHoldBecomeTextAndNestingStaysBelowTheAgentsLimit(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	deep := map[string]any{}
	node := deep
	for i := 0; i < 100; i++ {
		next := map[string]any{}
		node["next"] = next
		node = next
	}
	log := newLogger(c, nil)
	for i := 0; i < 40; i++ { // far more groups than the agent's depth allows with the values below
		log = log.WithGroup(fmt.Sprintf("g%d", i))
	}
	log.Info("odd values", "nan", math.NaN(), "inf", math.Inf(1), "obj", panicky{}, "deep", deep,
		"channel", make(chan int), "bytes", []byte("raw"), "nilerr", error(nil))
	flush(t, c, 5*time.Second)

	record := agent.expect(t, 1)[0]
	group := record
	for i := 0; i < maxGroupDepth; i++ {
		group = group[fmt.Sprintf("g%d", i)].(map[string]any)
	}
	if group["nan"] != "NaN" || group["inf"] != "+Inf" || group["obj"] != "!PANIC: no" || group["bytes"] != "raw" {
		t.Errorf("values: %v", group)
	}
	if _, ok := group["deep"].(string); !ok {
		t.Errorf("a value too deep for the agent is its JSON text: %T", group["deep"])
	}
	if s, _ := group["channel"].(string); !strings.HasPrefix(s, "0x") {
		t.Errorf("a value encoding/json refuses is its text: %v", group["channel"])
	}
	if group["nilerr"] != nil {
		t.Errorf("a nil error is null: %v", group["nilerr"])
	}
}

func TestLevelsAreOpenTelemetrysSeverityNamesAndTheHandlerLevelFilters(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	log := slog.New(c.Handler(&HandlerOptions{Level: slog.LevelInfo}))
	log.Debug("filtered")
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError, slog.LevelInfo + 2, slog.LevelError + 4} {
		log.Log(context.Background(), level, "at a level")
	}
	flush(t, c, 5*time.Second)
	var levels []string
	for _, r := range agent.expect(t, 5) {
		levels = append(levels, r["level"].(string))
	}
	if got := strings.Join(levels, ","); got != "info,warn,error,info+2,fatal" {
		t.Errorf("levels %s", got)
	}
}

func TestAddSourceNamesTheCaller(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	c := newClient(t, path)
	slog.New(c.Handler(&HandlerOptions{AddSource: true})).Info("here")
	flush(t, c, 5*time.Second)
	source := agent.expect(t, 1)[0]["source"].(map[string]any)
	if !strings.HasSuffix(source["function"].(string), "TestAddSourceNamesTheCaller") || !strings.HasSuffix(source["file"].(string), "records_test.go") {
		t.Errorf("source %v", source)
	}
}

// The handler keeps slog's rules for handlers (groups, inlining, empty attributes, resolving).
func TestTheHandlerPassesSlogsHandlerTests(t *testing.T) {
	path := socketPath(t)
	agent := startFakeAgent(t, path)
	// Acknowledged: Flush returns once the agent has taken every record.
	c := newClient(t, path, WithAcknowledged(true))
	results := func() []map[string]any {
		flush(t, c, 5*time.Second)
		records := agent.records(t)
		for _, r := range records {
			r[slog.MessageKey] = r["message"] // slogtest looks for "msg"
			delete(r, "message")
		}
		return records
	}
	if err := slogtest.TestHandler(c.Handler(nil), results); err != nil {
		t.Error(err)
	}
}
