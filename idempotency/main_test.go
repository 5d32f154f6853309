package idempotency

import (
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/leaktest"
)

// Every goroutine the tests start must have ended when they are done.
func TestMain(m *testing.M) { leaktest.Main(m) }
