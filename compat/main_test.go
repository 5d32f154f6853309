package compat

import (
	"flag"
	"testing"

	"github.com/ferryhq/ferry/internal/agenttest"
	"github.com/ferryhq/ferry/internal/kafkatest"
)

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	kafkatest.Main(m)
}
