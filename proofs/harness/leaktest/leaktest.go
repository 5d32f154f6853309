// Package leaktest fails a package's tests when goroutines they started
// are still running once they have all finished: a component that starts
// goroutines must stop every one in Shutdown (or when its connection
// ends), or an agent that reloads and restarts parts of itself, or a
// long-lived client, slowly fills with them.
package leaktest

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// ignored are goroutines that outlive a test by design, not by a leak:
// the standard library's and gRPC's own long-lived workers.
var ignored = []goleak.Option{
	// glog-style and OpenCensus/OTel background workers some
	// dependencies start once per process.
	goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	goleak.IgnoreAnyFunction("github.com/klauspost/compress/zstd.(*blockDec).startDecoder"),
}

// Main runs m's tests, then checks for goroutines left running, and exits.
func Main(m *testing.M, opts ...goleak.Option) { os.Exit(Wrap(m, opts...).Run()) }

// Wrap is m whose Run also checks, after the tests passed, for goroutines
// left running (idle keep-alive connections of the default HTTP client are
// closed first: they are the client's, not the code under test's).
// FERRY_LEAKTEST=off skips the check.
func Wrap(m interface{ Run() int }, opts ...goleak.Option) interface{ Run() int } {
	return runner{m: m, opts: opts}
}

type runner struct {
	m    interface{ Run() int }
	opts []goleak.Option
}

func (r runner) Run() int {
	code := r.m.Run()
	if code != 0 || os.Getenv("FERRY_LEAKTEST") == "off" {
		return code
	}
	if t, ok := http.DefaultTransport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	if err := goleak.Find(append(ignored, r.opts...)...); err != nil {
		fmt.Fprintf(os.Stderr, "leaktest: goroutines still running after the tests:\n%v\n", err)
		return 1
	}
	return 0
}
