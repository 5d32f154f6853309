package packaging

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// ferryBin is the agent built for these tests ("" with -short).
var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	kafkatest.Main(m)
}

// tool returns the path of a third-party tool the project builds and caches
// with one of its scripts: `script buildVerb` builds it if missing (a fresh
// machine's make test has scripts/test.sh do that first). With -short it
// is never built: the test is skipped unless pathVerb finds it cached.
func tool(t *testing.T, script, buildVerb, pathVerb string) string {
	t.Helper()
	root, err := agenttest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "scripts", script)
	if testing.Short() {
		out, err := exec.Command(path, pathVerb).Output()
		if err != nil {
			t.Skipf("scripts/%s has not built it yet, and -short builds nothing (scripts/%s %s)", script, script, buildVerb)
		}
		return strings.TrimSpace(string(out))
	}
	cmd := exec.Command(path, buildVerb)
	cmd.Stderr = os.Stderr // its progress, when it builds
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/%s %s: %v", script, buildVerb, err)
	}
	return strings.TrimSpace(string(out))
}

// run runs a command and fails the test with its output if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}
