package soak

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	report.M = m
	kafkatest.Main(report)
}

// settings are the soak's knobs, from the environment (make soak sets them).
type settings struct {
	duration time.Duration // load under faults, per mode
	full     bool          // make soak: progress lines, the report, longer checks
	seed     uint64
	modes    []string
	port     int // the cluster's base port; 0 = free ports
	rate     int // records per second per source
}

var allModes = []string{"kafka", "spool", "spill", "exactly_once"}

// shortModes are the short version's (make test): the two guarantees of
// the spool, which every fault touches most; kafka and spill modes have
// their fault tests in proofs/faults and run here in make soak. Keeps
// make test's cost at about a minute.
var shortModes = []string{"spool", "exactly_once"}

func loadSettings(t *testing.T) settings {
	t.Helper()
	s := settings{duration: 15 * time.Second, rate: 300, modes: shortModes}
	if v := os.Getenv("FERRY_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("FERRY_SOAK_DURATION=%q: want a duration of at least 10s", v)
		}
		s.duration, s.full, s.modes = d, true, allModes
	}
	if v := os.Getenv("FERRY_SOAK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FERRY_SOAK_SEED=%q: want an unsigned integer", v)
		}
		s.seed = n
	} else {
		s.seed = uint64(time.Now().UnixNano()) % 1_000_000_000
	}
	if v := os.Getenv("FERRY_SOAK_MODES"); v != "" && v != "all" {
		s.modes = nil
		for _, m := range strings.Split(v, ",") {
			m = strings.TrimSpace(m)
			ok := false
			for _, a := range allModes {
				ok = ok || a == m
			}
			if !ok {
				t.Fatalf("FERRY_SOAK_MODES: unknown mode %q (want some of %s)", m, strings.Join(allModes, ","))
			}
			s.modes = append(s.modes, m)
		}
	}
	if v := os.Getenv("FERRY_SOAK_KAFKA_PORT"); v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("FERRY_SOAK_KAFKA_PORT=%q", v)
		}
		s.port = p
	}
	if v := os.Getenv("FERRY_SOAK_RATE"); v != "" {
		r, err := strconv.Atoi(v)
		if err != nil || r <= 0 {
			t.Fatalf("FERRY_SOAK_RATE=%q", v)
		}
		s.rate = r
	}
	return s
}

// hasGuarantee says whether this agent knows delivery.guarantee (the
// exactly_once mode): its complete default configuration names it.
func hasGuarantee(t *testing.T) bool {
	t.Helper()
	out, err := exec.Command(ferryBin, "config", "default").Output()
	if err != nil {
		t.Fatalf("ferry config default: %v", err)
	}
	return strings.Contains(string(out), "guarantee:")
}

// javaProgram compiles the SDK's sources and testdata/Soak.java against
// Kafka's jars (kafka-clients, and the lz4 and zstd codecs the SDK uses,
// the same versions as sdk/java's pom) and returns the java command's
// classpath.
func javaProgram(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(kafkaLocal(), "classpath").Output()
	if err != nil {
		t.Fatalf("kafka-local classpath: %v", err)
	}
	kafkaCP := strings.TrimSpace(string(out))
	root, err := agenttest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	srcs, _ := filepath.Glob(filepath.Join(root, "sdk/java/src/main/java/dev/ferry/producer/*.java"))
	if len(srcs) == 0 {
		t.Fatal("no Java SDK sources under sdk/java")
	}
	dir := t.TempDir()
	args := append([]string{"-nowarn", "-d", dir, "-cp", kafkaCP, filepath.Join(root, "proofs/soak/testdata/Soak.java")}, srcs...)
	if out, err := exec.Command("javac", args...).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	return dir + string(os.PathListSeparator) + kafkaCP
}

func kafkaLocal() string {
	root, err := agenttest.ModuleRoot()
	if err != nil {
		panic(err)
	}
	return filepath.Join(root, "scripts", "kafka-local")
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func fmtCounts(m map[string]int) string {
	var parts []string
	for _, k := range faultKinds {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
