package server

// The bound on connections a listener holds at once. Each connection costs
// buffers and goroutines however little it sends, so a local process that
// opens thousands must not make ferry hold thousands: past max_connections
// a new connection is answered at once (an HTTP 503 with Retry-After where
// the protocol allows; closed otherwise) and counted, never queued inside
// ferry.

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// httpRefusal is what an HTTP/1.1 listener sends to a connection over the
// limit before closing it.
var httpRefusal = func() []byte {
	body := `{"error":"ferry has max_connections open on this listener; retry later","reason":"too_many_connections"}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// limitedListener admits at most max connections at once.
type limitedListener struct {
	net.Listener
	max     int64
	refusal []byte
	active  atomic.Int64
	gauge   prometheus.Gauge
	refused prometheus.Counter
}

// limit bounds ln to max open connections (0: unbounded), reporting as
// listener name. refusal, if not nil, is written to a refused connection.
func limit(ln net.Listener, max int, name string, reg prometheus.Registerer, refusal []byte) *limitedListener {
	g := shared(reg, connectionsVec())
	r := shared(reg, refusedVec())
	return &limitedListener{Listener: ln, max: int64(max), refusal: refusal, gauge: g.WithLabelValues(name), refused: r.WithLabelValues(name)}
}

// Accept returns the next connection within the bound; those beyond it are
// answered and closed here.
func (l *limitedListener) Accept() (net.Conn, error) {
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
func (l *limitedListener) Active() int64 { return l.active.Load() }

type conn struct {
	net.Conn
	l    *limitedListener
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.l.active.Add(-1)
		c.l.gauge.Dec()
	})
	return c.Conn.Close()
}

// shared registers c, or returns the collector already registered under its
// name (every listener reports in the same two series).
func shared[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return are.ExistingCollector.(C)
		}
		panic(err)
	}
	return c
}

func connectionsVec() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_receiver_connections",
		Help: "Connections open on a listener."}, []string{"receiver"})
}

func refusedVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_receiver_connections_refused_total",
		Help: "Connections refused because the listener had max_connections open."}, []string{"receiver"})
}
