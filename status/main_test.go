package status

import (
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/leaktest"
)

// Every goroutine the tests start (the sampling loop) must have ended.
func TestMain(m *testing.M) { leaktest.Main(m) }
