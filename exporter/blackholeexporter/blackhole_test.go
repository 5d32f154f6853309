package blackholeexporter

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

func TestAcknowledgesAndCounts(t *testing.T) {
	e := New(telemetry.TestSettings())
	b := &record.Batch{Records: []record.Record{{Topic: "a", Value: []byte("xy")}, {Topic: "a", Key: []byte("k"), Value: []byte("z")}, {Topic: "b", Value: []byte("q")}}}
	var got error = errSentinel{}
	b.OnDone(func(err error) { got = err })
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if got != nil {
		t.Fatalf("completion %v, want nil (acknowledged)", got)
	}
	if testutil.ToFloat64(e.sent.WithLabelValues("a")) != 2 || testutil.ToFloat64(e.sent.WithLabelValues("b")) != 1 ||
		testutil.ToFloat64(e.sentBytes.WithLabelValues("a")) != 4 {
		t.Fatal("counters wrong")
	}
}

type errSentinel struct{}

func (errSentinel) Error() string { return "not completed" }
