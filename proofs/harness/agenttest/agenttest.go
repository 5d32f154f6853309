// Package agenttest runs the real ferry binary for tests that must see the
// process as users do: its ports, its exit, its memory (VmHWM) and its
// metrics.
package agenttest

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/tools/bench/proc"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// BuildForTests compiles the binary for a test package (its TestMain),
// unless the tests run with -short; it exits the process if the build
// fails. cleanup removes it.
func BuildForTests() (bin string, cleanup func()) {
	if testing.Short() {
		return "", func() {}
	}
	dir, err := os.MkdirTemp("", "ferry-bin")
	if err != nil {
		panic(err)
	}
	root, err := ModuleRoot()
	if err != nil {
		panic(err)
	}
	if bin, err = Build(root, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return bin, func() { os.RemoveAll(dir) }
}

// ModuleRoot is the agent module's root: the nearest folder above the
// working directory (a test's package folder) whose go.mod is ferry's.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/ferryhq/ferry\n") {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod of module github.com/ferryhq/ferry above the working directory")
		}
		dir = up
	}
}

// Build compiles ./cmd/ferry from the module root into dir.
func Build(root, dir string) (string, error) {
	bin := filepath.Join(dir, "ferry")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/ferry")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
}

// Agent is a running ferry binary on free loopback ports.
type Agent struct {
	t                       *testing.T
	Cmd                     *exec.Cmd
	HTTP, Admin, OTLP, GRPC string // listen addresses
	Local, Socket           string // the local protocol's TCP address and Unix socket
	KafkaFront              string // the Kafka-protocol front's address (when enabled)
	JaegerGRPC              string // Jaeger's gRPC collector service (with the jaeger door open)
	Config                  string // the config file given as yaml ("" if none): rewrite it, then Reload
	Logs                    *SyncBuffer
	exited                  chan error
}

// SyncBuffer collects the agent's output.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreeAddr is a loopback address nothing listens on.
func FreeAddr(t *testing.T) string { return freeAddr(t) }

// freeAddr is a variable so that a test can hand Start a port that is taken.
var freeAddr = func(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs the ferry binary bin with config file yaml (may be "") and
// --set overrides, on free ports, and waits until every receiver listens
// (/readyz no longer names the pipeline "starting"; not until it is ready:
// Kafka may be down on purpose).
//
// A port found free can be taken before the agent binds it: test packages
// run in parallel and every outgoing connection (to Kafka, to the agent)
// takes an ephemeral port from the same range. An agent that exits at start
// because one of its own listen addresses is in use is started again on new
// ports; any other exit fails the test.
func Start(t *testing.T, bin, yaml string, sets ...string) *Agent {
	t.Helper()
	return startRetry(t, bin, yaml, false, sets)
}

// StartPiped is Start with the configuration on the agent's standard
// input (-c /dev/stdin), as `cat ferry.yaml | ferry run -c /dev/stdin`.
func StartPiped(t *testing.T, bin, yaml string, sets ...string) *Agent {
	t.Helper()
	return startRetry(t, bin, yaml, true, sets)
}

func startRetry(t *testing.T, bin, yaml string, piped bool, sets []string) *Agent {
	t.Helper()
	const attempts = 5
	for i := 1; ; i++ {
		a, err := start(t, bin, yaml, piped, sets)
		if err == nil {
			return a
		}
		if i == attempts || !a.portTaken() {
			t.Fatalf("%v\n%s", err, a.Logs.String())
		}
		t.Logf("agent start %d: a listen port was taken meanwhile; again on new ports", i)
	}
}

// portTaken says whether the agent's log shows it lost one of the ports
// Start chose (and not one the test chose in its own overrides).
func (a *Agent) portTaken() bool {
	logs := a.Logs.String()
	if !strings.Contains(logs, "address already in use") {
		return false
	}
	for _, addr := range []string{a.HTTP, a.Admin, a.OTLP, a.GRPC, a.Local, a.KafkaFront, a.JaegerGRPC} {
		if strings.Contains(logs, addr+": bind: address already in use") {
			return true
		}
	}
	return false
}

func start(t *testing.T, bin, yaml string, piped bool, sets []string) (*Agent, error) {
	t.Helper()
	a := &Agent{t: t, HTTP: freeAddr(t), Admin: freeAddr(t), OTLP: freeAddr(t), GRPC: freeAddr(t), Local: freeAddr(t),
		KafkaFront: freeAddr(t), JaegerGRPC: freeAddr(t), Logs: &SyncBuffer{}, exited: make(chan error, 1)}
	// A Unix socket's path must stay under 108 bytes: a short directory.
	sockDir, err := os.MkdirTemp("", "fy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	a.Socket = filepath.Join(sockDir, "f.sock")
	args := []string{"run"}
	if piped {
		args = append(args, "-c", "/dev/stdin")
	} else if yaml != "" {
		f := filepath.Join(t.TempDir(), "ferry.yaml")
		if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		a.Config = f
		args = append(args, "-c", f)
	}
	for _, s := range append([]string{"receivers.http.listen=" + a.HTTP, "telemetry.admin.listen=" + a.Admin,
		"receivers.otlp.http.listen=" + a.OTLP, "receivers.otlp.grpc.listen=" + a.GRPC,
		"receivers.local.listen=" + a.Local, "receivers.local.socket=" + a.Socket,
		"receivers.kafka.listen=" + a.KafkaFront, "receivers.otlp.jaeger_grpc_endpoint=" + a.JaegerGRPC}, sets...) {
		args = append(args, "--set", s)
	}
	a.Cmd = exec.Command(bin, args...)
	a.Cmd.Stderr, a.Cmd.Stdout = a.Logs, a.Logs
	if piped {
		a.Cmd.Stdin = strings.NewReader(yaml)
	}
	if err := a.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.Cmd.Wait() }()
	t.Cleanup(func() {
		_ = a.Cmd.Process.Kill()
		if t.Failed() {
			t.Logf("agent log (tail):\n%s", Tail(a.Logs.String(), 6000))
		}
	})
	// An admin listener with TLS is probed over TLS; whether it serves is
	// all this asks (the tests check its certificate themselves).
	probe, scheme := http.DefaultClient, "http://"
	for _, s := range sets {
		if strings.HasPrefix(s, "telemetry.admin.tls.cert_file=") {
			probe = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			scheme = "https://"
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The admin listener starts first, so it answers while the
		// exporter, the spool reader and the receivers are still starting
		// (a restarted agent's Kafka front was dialled before it listened:
		// connection refused). /readyz names the pipeline "starting" until
		// every door listens; ready or not for other reasons (Kafka down
		// in some tests), the doors are open once that check is gone.
		if res, err := probe.Get(scheme + a.Admin + "/readyz"); err == nil {
			var body struct {
				NotReady map[string]string `json:"not_ready"`
			}
			derr := json.NewDecoder(res.Body).Decode(&body)
			res.Body.Close()
			if _, starting := body.NotReady["pipeline"]; derr == nil && !starting {
				return a, nil
			}
		}
		select {
		case err := <-a.exited:
			return a, fmt.Errorf("agent exited at start: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			_ = a.Cmd.Process.Kill()
			return a, fmt.Errorf("agent not started after 30 s (its /readyz never said the pipeline was running)")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Alive fails the test if the agent has exited.
func (a *Agent) Alive() {
	a.t.Helper()
	select {
	case err := <-a.exited:
		a.t.Fatalf("agent died: %v\n%s", err, Tail(a.Logs.String(), 6000))
	default:
	}
}

// ResetPeak starts a new peak-RSS window (Linux: clear_refs 5 resets VmHWM).
func (a *Agent) ResetPeak() {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", a.Cmd.Process.Pid), []byte("5"), 0)
}

// Peak is the peak RSS since the last ResetPeak (or start), in bytes; -1
// if the agent is gone.
func (a *Agent) Peak() int64 {
	if kb := proc.StatusKB(a.Cmd.Process.Pid, "VmHWM"); kb > 0 {
		return kb << 10
	}
	return -1
}

// Metric sums every series of a metric from /metrics; name{a="x",b="y"}
// sums only the series that carry those labels (others may be present).
func (a *Agent) Metric(name string) float64 {
	res, err := http.Get("http://" + a.Admin + "/metrics")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	name, labels, _ := strings.Cut(name, "{")
	want := strings.Split(strings.TrimSuffix(labels, "}"), ",")
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name) || len(line) == len(name) || (line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		series, _, _ := strings.Cut(line[len(name):], " ")
		match := true
		for _, l := range want {
			match = match && (l == "" || strings.Contains(series, l))
		}
		if !match {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

// Kill ends the agent with SIGKILL, as a crash would.
func (a *Agent) Kill() {
	_ = a.Cmd.Process.Signal(syscall.SIGKILL)
	<-a.exited
}

// Stop ends the agent with SIGTERM and requires a clean exit within 60 s.
func (a *Agent) Stop() {
	a.t.Helper()
	_ = a.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.exited:
		if err != nil {
			a.t.Fatalf("agent exited with %v:\n%s", err, Tail(a.Logs.String(), 4000))
		}
	case <-time.After(60 * time.Second):
		a.t.Fatal("agent did not stop within 60 s")
	}
}

// Reload sends SIGHUP: the agent reads its config file again.
func (a *Agent) Reload() {
	a.t.Helper()
	if err := a.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		a.t.Fatal(err)
	}
}

// CPU is the CPU time the agent has used so far (user + system); -1 if
// it is gone.
func (a *Agent) CPU() time.Duration {
	t, ok := proc.CPUTicks(a.Cmd.Process.Pid)
	if !ok {
		return -1
	}
	return time.Duration(float64(t) / proc.ClkTck() * float64(time.Second))
}

// ReplaceSection rewrites the part of markdown file path between the
// lines begin and end (kept) with body.
func ReplaceSection(path, begin, end, body string) error {
	return report.ReplaceSection(path, begin, end, body)
}

// Machine describes this machine for a report: cores and CPU model.
func Machine() string { return report.MachineLine() }

// Report collects one row per measured case and, after the package's tests,
// writes them as a markdown table into the section of the file named by
// environment variable Env (make faults, make hostile); nothing is written
// when it is unset or a test failed.
type Report[T any] struct {
	Env, Begin, End string
	Render          func(rows []T) string
	M               interface{ Run() int }

	mu   sync.Mutex
	rows []T
}

// Add logs row as a "result:" line and keeps it for the report.
func (r *Report[T]) Add(t testing.TB, row T) {
	t.Helper()
	b, _ := json.Marshal(row)
	t.Logf("result: %s", b)
	r.mu.Lock()
	r.rows = append(r.rows, row)
	r.mu.Unlock()
}

// Run runs the tests, then writes the report.
func (r *Report[T]) Run() int {
	code := r.M.Run()
	if path := os.Getenv(r.Env); path != "" && len(r.rows) > 0 && code == 0 {
		if err := ReplaceSection(path, r.Begin, r.End, r.Render(r.rows)); err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			return 1
		}
	}
	return code
}
