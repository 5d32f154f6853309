package graceful

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestIdleNewConnectionDoesNotHoldShutdown: a connection that never sent a
// request would make net/http wait 5 s; a request in progress is waited for.
func TestIdleNewConnectionDoesNotHoldShutdown(t *testing.T) {
	var tr Tracker
	release := make(chan struct{})
	srv := &http.Server{Handler: tr.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(200)
	}))}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	idle, err := net.Dial("tcp", ln.Addr().String()) // never sends a request
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	answered := make(chan int, 1)
	go func() {
		res, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			answered <- 0
			return
		}
		res.Body.Close()
		answered <- res.StatusCode
	}()
	for tr.Active() == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { time.Sleep(200 * time.Millisecond); close(release) }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := Shutdown(ctx, srv, &tr); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > time.Second {
		t.Fatalf("shutdown took %s: it must wait for the request (200 ms) and not for the idle connection (5 s)", d)
	}
	if code := <-answered; code != 200 {
		t.Fatalf("the request in progress was not answered: %d", code)
	}
}
