package agenttest

import (
	"net"
	"testing"
)

// A port chosen free and taken before the agent binds it must not fail the
// test that started the agent: CI runs test packages in parallel.
func TestStartAgainWhenAPortIsTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := Build(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	calls := 0
	orig := freeAddr
	defer func() { freeAddr = orig }()
	freeAddr = func(t *testing.T) string {
		calls++
		if calls == 4 { // the first attempt's OTLP/gRPC address
			return taken.Addr().String()
		}
		return orig(t)
	}
	a := Start(t, bin, "", "exporter.type=blackhole")
	if a.GRPC == taken.Addr().String() {
		t.Fatalf("agent kept the taken address %s", a.GRPC)
	}
	if calls < 12 {
		t.Fatalf("ports chosen %d times; want a second attempt", calls)
	}
	a.Alive()
}
