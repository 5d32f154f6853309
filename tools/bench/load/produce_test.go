package load

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A broker that accepts connections and never answers: the client's buffer
// fills and Produce blocks. --duration must still end the run, with an
// account of the records that were not sent (it once ran for an hour past a
// 40 s --duration against a cluster whose broker had stopped).
func TestDurationEndsARunAgainstASilentBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	report := filepath.Join(t.TempDir(), "r.json")
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- ProduceCmd([]string{"--target", "kafka://" + ln.Addr().String(), "--duration", "1s", "--flush-timeout", "1s",
			"--num-records", "100000000", "--record-size", "10", "--reporting-interval", "100000", "--report-json", report})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Logf("ended with: %v", err)
		}
		var res Result
		b, rerr := os.ReadFile(report)
		if rerr == nil {
			rerr = json.Unmarshal(b, &res)
		}
		if rerr != nil {
			t.Fatalf("no report: %v (run error %v)", rerr, err)
		}
		if res.Records != 0 || res.Failed == 0 {
			t.Fatalf("report says %d acknowledged, %d failed; want 0 and the unsent ones", res.Records, res.Failed)
		}
		if el := time.Since(start); el > 20*time.Second {
			t.Fatalf("took %s for a 1 s run", el)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the run did not end a minute after its 1 s --duration")
	}
}
