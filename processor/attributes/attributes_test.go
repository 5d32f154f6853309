package attributes

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/signal"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestActionsAndDrops(t *testing.T) {
	cfg := Config{
		Actions: []Action{
			{Action: "delete", Key: "http.method1"},
			{Action: "rename", Key: "http.method2", NewKey: "route"},
			{Action: "hash", Key: "http.method3"},
			{Action: "insert", Key: "env", Value: "prod"},
			{Action: "update", Key: "missing", Value: "x"},
			{Action: "upsert", Key: "service.name", Value: "renamed", On: "resource"},
			{Action: "keep", Keys: []string{"service.name"}, On: "resource"},
		},
		DropIf: []Match{{Key: "drop", Equals: "yes"}},
	}
	p, err := New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	td := otlpgen.New(1).Traces(4)
	spans := td.ResourceSpans().At(0).ScopeSpans()
	spans.At(1).Spans().At(0).Attributes().PutStr("drop", "yes")
	h3, _ := spans.At(0).Spans().At(0).Attributes().Get("http.method3")
	orig3 := h3.Str()
	raw, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	out, dropped, err := p.Apply(signal.Traces, "", raw)
	if err != nil || dropped != 1 {
		t.Fatalf("err %v dropped %d", err, dropped)
	}
	got, _ := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(out)
	if got.SpanCount() != 3 {
		t.Fatalf("%d spans", got.SpanCount())
	}
	res := got.ResourceSpans().At(0).Resource().Attributes().AsRaw()
	if len(res) != 1 || res["service.name"] != "renamed" {
		t.Fatalf("resource %v", res)
	}
	a := got.ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Attributes().AsRaw()
	if _, ok := a["http.method1"]; ok || a["route"] == nil || a["http.method2"] != nil || a["env"] != "prod" || a["missing"] != nil {
		t.Fatalf("attributes %v", a)
	}
	if h := a["http.method3"].(string); len(h) != 64 || h == orig3 {
		t.Fatalf("hash %q", h)
	}
	if v := testutil.ToFloat64(p.dropped.WithLabelValues("filter", "traces", "")); v != 1 {
		t.Fatalf("dropped counter %v", v)
	}
}

func TestTenantOverridesAndSignals(t *testing.T) {
	p, _ := New(Config{
		Actions: []Action{{Action: "delete", Key: "http.method1", Signals: []string{"logs"}}},
		Tenants: map[string]Rules{"vip": {}},
	}, telemetry.TestSettings())
	if p.Active(signal.Traces, "") || !p.Active(signal.Logs, "") || p.Active(signal.Logs, "vip") {
		t.Fatal("Active is wrong")
	}
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 8)).MarshalProto()
	out, _, err := p.Apply(signal.Logs, "", raw)
	if err != nil {
		t.Fatal(err)
	}
	ld, _ := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(out)
	if _, ok := ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().At(0).Attributes().Get("http.method1"); ok {
		t.Fatal("logs action not applied")
	}
	// Metrics: drop points by resource match.
	m, _ := New(Config{DropIf: []Match{{On: "resource", Key: "service.name", Equals: "generator.service", Signals: []string{"metrics"}}}}, telemetry.TestSettings())
	mraw, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(2, 2, 2)).MarshalProto()
	mout, dropped, err := m.Apply(signal.Metrics, "", mraw)
	if err != nil || dropped != 6 {
		t.Fatalf("%v dropped %d", err, dropped)
	}
	md, _ := (&pmetric.ProtoUnmarshaler{}).UnmarshalMetrics(mout)
	if md.DataPointCount() != 0 {
		t.Fatalf("%d points left", md.DataPointCount())
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{Actions: []Action{{Action: "explode", Key: "a"}}},
		{Actions: []Action{{Action: "rename", Key: "a"}}},
		{Actions: []Action{{Action: "keep"}}},
		{Actions: []Action{{Action: "delete", Key: "a", On: "scope"}}},
		{DropIf: []Match{{Equals: "x"}}},
		{Tenants: map[string]Rules{"t": {Actions: []Action{{Action: "hash"}}}}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// BenchmarkApply_100_Spans is the cost of the pdata detour a request with
// filters takes (requests without filters skip it entirely).
func BenchmarkApply_100_Spans(b *testing.B) {
	p, _ := New(Config{Actions: []Action{{Action: "delete", Key: "http.method1"}, {Action: "hash", Key: "http.method2"}}}, telemetry.TestSettings())
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(100)).MarshalProto()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, err := p.Apply(signal.Traces, "", raw); err != nil {
			b.Fatal(err)
		}
	}
}
