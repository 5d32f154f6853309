// Package graceful owns stopping ferry's HTTP listeners: requests in
// progress finish (they may be waiting for Kafka's acknowledgement), while
// connections that never sent a request do not hold the stop.
//
// net/http's Server.Shutdown treats a connection that has not sent its first
// request as busy for 5 seconds. Go's own HTTP client leaves such
// connections behind routinely (it dials a spare while waiting for an idle
// one), so a stop with a short shutdown_timeout failed for no reason. Here,
// once no handler is running, the remaining connections are closed: a client
// on one of them gets no answer, so nothing it sent was acknowledged.
package graceful

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"
)

// Tracker counts requests in progress.
type Tracker struct{ active atomic.Int64 }

// Wrap counts h's requests.
func (t *Tracker) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.active.Add(1)
		defer t.active.Add(-1)
		h.ServeHTTP(w, r)
	})
}

// Active is the number of requests in progress.
func (t *Tracker) Active() int64 { return t.active.Load() }

// Shutdown stops srv: no new connections, requests in progress finish
// within ctx, then every connection is closed.
func Shutdown(ctx context.Context, srv *http.Server, t *Tracker) error {
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if t.Active() == 0 {
				_ = srv.Close()
				<-done
				return nil
			}
		}
	}
}
