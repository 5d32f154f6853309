package operate

import (
	"flag"
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	kafkatest.Main(m)
}
