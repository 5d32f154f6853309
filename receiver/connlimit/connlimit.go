// Package connlimit owns the bound on connections a receiver's listener
// holds at once. Each connection costs buffers and goroutines however
// little it sends, so a local process that opens thousands must not make
// ferry hold thousands: past max_connections a new connection is answered
// at once (an HTTP 503 with Retry-After where the protocol allows; closed
// otherwise) and counted, never queued inside ferry.
package connlimit

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/telemetry"
)

// HTTPRefusal is what an HTTP/1.1 listener sends to a connection over the
// limit before closing it.
var HTTPRefusal = func() []byte {
	body := `{"error":"ferry has max_connections open on this listener; retry later","reason":"too_many_connections"}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// Listener admits at most max connections at once.
type Listener struct {
	net.Listener
	max     int64
	refusal []byte
	active  atomic.Int64
	gauge   prometheus.Gauge
	refused prometheus.Counter
}

// Wrap bounds ln to max open connections (0: unbounded), reporting as
// receiver name. refusal, if not nil, is written to a refused connection.
func Wrap(ln net.Listener, max int, name string, reg prometheus.Registerer, refusal []byte) *Listener {
	g := telemetry.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_receiver_connections",
		Help: "Connections open on a receiver's listener."}, []string{"receiver"}))
	r := telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_connections_refused_total",
		Help: "Connections refused because the listener had max_connections open."}, []string{"receiver"}))
	return &Listener{Listener: ln, max: int64(max), refusal: refusal, gauge: g.WithLabelValues(name), refused: r.WithLabelValues(name)}
}

// Accept returns the next connection within the bound; those beyond it are
// answered and closed here.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if n := l.active.Add(1); l.max > 0 && n > l.max {
			l.active.Add(-1)
			l.refused.Inc()
			if l.refusal != nil {
				// A new socket's send buffer takes this without blocking;
				// the deadline only guards against the unexpected.
				_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				_, _ = c.Write(l.refusal)
			}
			_ = c.Close()
			continue
		}
		l.gauge.Inc()
		return &conn{Conn: c, l: l}, nil
	}
}

// Active is the number of open connections.
func (l *Listener) Active() int64 { return l.active.Load() }

type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.active.Add(-1)
		c.l.gauge.Dec()
	})
	return c.Conn.Close()
}
