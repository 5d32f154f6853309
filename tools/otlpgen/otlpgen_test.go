package otlpgen

import (
	"strings"
	"testing"

	"github.com/pierrec/lz4/v4"
)

func lz4Ratio(s string) float64 {
	dst := make([]byte, lz4.CompressBlockBound(len(s)))
	n, err := lz4.CompressBlock([]byte(s), dst, nil)
	if err != nil {
		panic(err)
	}
	if n == 0 { // incompressible
		return 1
	}
	return float64(n) / float64(len(s))
}

// The two body kinds are what the benchmarks say they are: random bodies
// do not compress, text bodies compress about as application logs do, and
// both have exactly the size asked for and the same content for the same
// seed.
func TestBodies(t *testing.T) {
	var random, text strings.Builder
	g := New(1)
	for range 200 {
		s, x := g.String(1024), g.Text(1024)
		if len(s) != 1024 || len(x) != 1024 {
			t.Fatalf("bodies of %d and %d bytes, want 1024", len(s), len(x))
		}
		random.WriteString(s)
		text.WriteString(x)
	}
	if r := lz4Ratio(random.String()); r < 0.95 {
		t.Fatalf("random bodies compress to %.2f", r)
	}
	if r := lz4Ratio(text.String()); r > 0.4 || r < 0.1 {
		t.Fatalf("text bodies compress to %.2f, want an application log's 0.1-0.4", r)
	}
	if New(5).Text(3000) != New(5).Text(3000) {
		t.Fatal("the same seed gave different text")
	}
	body := New(2).LogsOf(3, 500, BodyText).ResourceLogs().At(0).ScopeLogs().At(2).LogRecords().At(0).Body().Str()
	if len(body) != 500 || !strings.Contains(body, "com.example.shop.OrderService") {
		t.Fatalf("LogsOf text body: %q", body)
	}
}

// TracesOf groups consecutive spans into traces of the size asked for, the
// shape ferry-bench otlp --spans-per-trace sends.
func TestTracesOf(t *testing.T) {
	for _, per := range []int{1, 3, 10} {
		td := New(1).TracesOf(25, per)
		spans := td.ResourceSpans().At(0).ScopeSpans()
		traces := map[[16]byte]int{}
		for i := 0; i < spans.Len(); i++ {
			traces[spans.At(i).Spans().At(0).TraceID()]++
		}
		want := (25 + per - 1) / per
		if spans.Len() != 25 || len(traces) != want {
			t.Fatalf("per %d: %d spans in %d traces, want 25 in %d", per, spans.Len(), len(traces), want)
		}
		for id, n := range traces {
			if n > per {
				t.Fatalf("per %d: trace %x has %d spans", per, id, n)
			}
		}
	}
}
