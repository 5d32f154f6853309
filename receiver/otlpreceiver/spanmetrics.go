package otlpreceiver

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
)

// attachSpanMetrics connects the span metrics processor, if any: export
// hands it every traces request it decoded (before sampling), and its
// flushes come back through exportSpanMetrics.
func (r *Receiver) attachSpanMetrics(pre *receiver.Prechecks) {
	if pre == nil || pre.SpanMetrics == nil {
		return
	}
	r.spans = pre.SpanMetrics
	r.spanM = receivermetrics.New(r.set.Registry, "span_metrics")
	r.spans.SetSink(r.exportSpanMetrics)
}

// exportSpanMetrics sends one flushed ExportMetricsServiceRequest the way
// a client's OTLP metrics go (route, encode, attribute filters, memory
// charge, submit, wait as configured), as the server itself: no token, so
// the metrics topic of the receiver's configuration and the rate limit of
// requests without a token apply. Its requests and records are counted
// under receiver="span_metrics".
func (r *Receiver) exportSpanMetrics(ctx context.Context, req []byte) error {
	raw := r.body.Get(len(req))
	raw.B = append(raw.B, req...)
	o := r.export(ctx, r.spanM, encoding.Metrics, raw, nil, noHeaders{})
	if o.err == nil && o.rejected > 0 {
		return fmt.Errorf("%d of %d data points refused: %s", o.rejected, o.items, o.msg)
	}
	return o.err
}

// noHeaders is the header source of a request ferry makes itself.
type noHeaders struct{}

func (noHeaders) Get(string) string { return "" }
