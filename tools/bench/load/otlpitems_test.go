package load

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestOTLPItemsCountsLogsAndSpansOfEveryResourceAndScope(t *testing.T) {
	g := otlpgen.New(1)
	ld := g.Logs(7, 100)
	g.Logs(5, 10).ResourceLogs().MoveAndAppendTo(ld.ResourceLogs())
	ld.ResourceLogs().At(1).ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	b, err := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := OTLPItems(b); !ok || n != 13 {
		t.Fatalf("logs: %d, %v; want 13", n, ok)
	}
	td := g.Traces(11)
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
	b, err = ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := OTLPItems(b); !ok || n != 12 {
		t.Fatalf("traces: %d, %v; want 12", n, ok)
	}
	// What ferry's and the Collector's otlp_proto write: the pdata wire
	// form of ptrace.Traces itself.
	b, _ = (&ptrace.ProtoMarshaler{}).MarshalTraces(td)
	if n, ok := OTLPItems(b); !ok || n != 12 {
		t.Fatalf("ProtoMarshaler traces: %d, %v; want 12", n, ok)
	}
}

func TestOTLPItemsRefusesWhatIsNotOTLP(t *testing.T) {
	for _, v := range [][]byte{[]byte(`{"msg":"json, not protobuf"}`), {0x0a, 0x05, 0x01}, {0xff}} {
		if n, ok := OTLPItems(v); ok {
			t.Errorf("%q: counted %d items", v, n)
		}
	}
	if n, ok := OTLPItems(nil); !ok || n != 0 {
		t.Errorf("empty request: %d, %v", n, ok)
	}
}
