package main

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/leaktest"
	"github.com/ferryhq/ferry/tools/bench/proc"
)

func TestMain(m *testing.M) { kafkatest.Main(removeBuilt{leaktest.Wrap(m)}) }

// built is the binary the tests run, built once for all of them (a link
// of the whole agent each time cost the package seconds per test).
var built struct {
	once      sync.Once
	dir, path string
	out       []byte
	err       error
}

func buildFerry(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "ferry-cmd-test"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "ferry")
		built.out, built.err = exec.Command("go", "build", "-o", built.path, ".").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.path
}

// removeBuilt deletes the shared binary after the package's tests.
type removeBuilt struct{ m interface{ Run() int } }

func (r removeBuilt) Run() int {
	code := r.m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	return code
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestSIGTERMKeepsAcknowledgedRecords: SIGTERM while clients are mid-request
// and records sit in the Kafka client's linger buffer. The agent must stop
// cleanly, and every record it answered 200 for must be in Kafka.
func TestSIGTERMKeepsAcknowledgedRecords(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "it-sigterm", 3)
	bin := buildFerry(t)
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "run",
		"--set", "receivers.http.listen="+httpAddr, "--set", "telemetry.admin.listen="+adminAddr,
		"--set", "exporter.kafka.brokers=["+brokers+"]", "--set", "exporter.kafka.linger=50ms",
		"--set", "exporter.kafka.linger_mode=fixed", // records do sit in the linger buffer
		"--set", "shutdown_timeout=20s",
		"--set", "receivers.otlp.http.listen=127.0.0.1:0", "--set", "receivers.otlp.grpc.listen=127.0.0.1:0",
		"--set", "receivers.local.enabled=false")
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if !proc.WaitReady(adminAddr, 20*time.Second) {
		t.Fatalf("agent not ready:\n%s", logs.String())
	}

	var mu sync.Mutex
	acked := map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := &http.Client{Timeout: 30 * time.Second}
			for r := 0; ; r++ {
				select {
				case <-stop:
					return
				default:
				}
				var body bytes.Buffer
				var ids []string
				for i := 0; i < 200; i++ {
					id := fmt.Sprintf("c%d-r%d-%d", c, r, i)
					ids = append(ids, id)
					body.WriteString(id + "\n")
				}
				res, err := client.Post("http://"+httpAddr+"/v1/messages/"+topic, "application/x-ndjson", &body)
				if err != nil {
					return // the listener is closed: the agent is stopping
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode == 200 {
					mu.Lock()
					for _, id := range ids {
						acked[id] = true
					}
					mu.Unlock()
				}
			}
		}(c)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not stop within 30 s:\n%s", logs.String())
	}
	close(stop)
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("no request was acknowledged before SIGTERM")
	}
	if !strings.Contains(logs.String(), "ferry stopped") {
		t.Errorf("no final summary in the log:\n%s", logs.String())
	}
	recs := kafkatest.Consume(t, brokers, topic, len(acked), 60*time.Second)
	inKafka := map[string]bool{}
	for _, r := range recs {
		inKafka[string(r.Value)] = true
	}
	var lost int
	for id := range acked {
		if !inKafka[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged records are not in Kafka", lost, len(acked))
	}
	t.Logf("%d acknowledged records, all in Kafka (%d records in the topic)", len(acked), len(recs))
}

func TestCommands(t *testing.T) {
	bin := buildFerry(t)
	out, err := exec.Command(bin, "config", "default").Output()
	if err != nil || !bytes.Contains(out, []byte("memory_limit: 256MiB")) {
		t.Fatalf("config default: %v\n%s", err, out)
	}
	cfg := filepath.Join(t.TempDir(), "f.yaml")
	_ = os.WriteFile(cfg, out, 0o644)
	if out, err := exec.Command(bin, "validate", "-c", cfg).CombinedOutput(); err != nil {
		t.Fatalf("the printed default does not validate: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "validate", "--set", "exporter.kafka.linger=soon").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "exporter.kafka.linger") {
		t.Fatalf("bad value: %v\n%s", err, out)
	}
	// Valid settings that do not work together: valid, with a warning
	// naming both keys.
	out, err = exec.Command(bin, "validate", "--set", "exporter.kafka.partitioner=round_robin",
		"--set", "receivers.otlp.traces.partition=trace_id").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ferry: warning: receivers.otlp.traces.partition is trace_id") ||
		!strings.Contains(string(out), "exporter.kafka.partitioner is round_robin") || !strings.Contains(string(out), "configuration is valid") {
		t.Fatalf("validate with round_robin and trace_id: %v\n%s; want valid, with a warning", err, out)
	}
	// validate reads the files a configuration names, as start-up does: a
	// configuration that validates also starts.
	for _, set := range [][]string{
		{"exporter.kafka.tls.enabled=true", "exporter.kafka.tls.ca_file=NOTCA"},
		{"receivers.otlp.grpc.tls.cert_file=NOTCA", "receivers.otlp.grpc.tls.key_file=NOTCA"},
		{"receivers.local.tls.cert_file=" + filepath.Join(t.TempDir(), "missing.pem"), "receivers.local.tls.key_file=NOTCA"},
	} {
		notCA := filepath.Join(t.TempDir(), "ca.pem")
		_ = os.WriteFile(notCA, []byte("not a certificate\n"), 0o600)
		args := []string{"validate"}
		for _, s := range set {
			args = append(args, "--set", strings.ReplaceAll(s, "NOTCA", notCA))
		}
		out, err := exec.Command(bin, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "tls.") {
			t.Fatalf("validate %v: %v\n%s; want exit 1 naming the file", set, err, out)
		}
	}

	// A component that cannot be built is a clear error and exit 1, not a
	// crash (the Kafka exporter once panicked in New's clean-up).
	notCA := filepath.Join(t.TempDir(), "ca.pem")
	_ = os.WriteFile(notCA, []byte("not a certificate\n"), 0o600)
	run := exec.Command(bin, "run", "--set", "exporter.kafka.tls.enabled=true", "--set", "exporter.kafka.tls.ca_file="+notCA,
		"--set", "telemetry.admin.listen=127.0.0.1:0", "--set", "receivers.http.listen=127.0.0.1:0")
	run.Dir = t.TempDir()
	out, err = run.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "tls.ca_file") || strings.Contains(string(out), "panic") {
		t.Fatalf("run with a file that is no CA: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "version").Output(); err != nil || !strings.HasPrefix(string(out), "ferry ") {
		t.Fatalf("version: %v %s", err, out)
	}

	// Tokens: a key from keygen, a token from issue, inspect reads it back.
	key, err := exec.Command(bin, "token", "keygen").Output()
	if err != nil {
		t.Fatal(err)
	}
	authCfg := filepath.Join(t.TempDir(), "auth.yaml")
	_ = os.WriteFile(authCfg, []byte("auth:\n  keys:\n    - id: 3\n      secret: ${TEST_KEY}\n      issue: true\n"), 0o600)
	env := append(os.Environ(), "TEST_KEY="+strings.TrimSpace(string(key)))
	issue := exec.Command(bin, "token", "issue", "-c", authCfg, "--app", "shop", "--expires", "24h", "--topic", "logs=shop-logs")
	issue.Env = env
	tok, err := issue.Output()
	if err != nil {
		t.Fatalf("token issue: %v", err)
	}
	inspect := exec.Command(bin, "token", "inspect", "-c", authCfg, strings.TrimSpace(string(tok)))
	inspect.Env = env
	out, err = inspect.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "app: shop") || !strings.Contains(string(out), "topic.logs: shop-logs") {
		t.Fatalf("token inspect: %v\n%s", err, out)
	}
	if strings.Contains(string(out), strings.TrimSpace(string(key))) {
		t.Fatal("inspect printed the key")
	}
	bad := exec.Command(bin, "token", "inspect", "-c", authCfg, strings.TrimSpace(string(tok))[:40])
	bad.Env = env
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "invalid token") {
		t.Fatalf("truncated token: %v %s", err, out)
	}
}

// runFile starts `ferry run -c file`, its log in the returned buffer; the
// process is killed when the test ends (a graceful stop is the test's).
func runFile(t *testing.T, bin, file string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	logs := &bytes.Buffer{}
	cmd := exec.Command(bin, "run", "-c", file)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, logs
}

// TestSignalsFromTheFirstAnswer: from the moment the admin port answers
// (the first component to start), a SIGHUP reloads and a SIGTERM stops
// gracefully; neither kills the agent with Go's default action, which
// they did while the receivers were still starting.
func TestSignalsFromTheFirstAnswer(t *testing.T) {
	bin := buildFerry(t)
	for _, c := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGHUP", syscall.SIGHUP}, {"SIGTERM", syscall.SIGTERM}} {
		t.Run(c.name, func(t *testing.T) {
			adminAddr := freeAddr(t)
			file := filepath.Join(t.TempDir(), "ferry.yaml")
			cfg := fmt.Sprintf("exporter: {type: blackhole}\nreceivers:\n  http: {listen: %q}\n  otlp: {enabled: false}\n  local: {enabled: false}\ntelemetry: {admin: {listen: %q}}\n",
				freeAddr(t), adminAddr)
			if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd, _ := runFile(t, bin, file)
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(time.Millisecond) {
				if res, err := http.Get("http://" + adminAddr + "/healthz"); err == nil {
					res.Body.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("admin port never answered")
				}
			}
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			if c.sig == syscall.SIGHUP {
				if !proc.WaitReady(adminAddr, 15*time.Second) {
					t.Fatalf("not ready after an early SIGHUP (exited: %v)", len(exited) > 0)
				}
				select {
				case err := <-exited:
					t.Fatalf("an early SIGHUP ended the agent: %v", err)
				default:
				}
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("exit after an early %s: %v (want a graceful stop, status 0)", c.name, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("never stopped")
			}
		})
	}
}

// TestSIGHUPReloadsKeys: edit the file, send SIGHUP, and the new key works
// while the old one is refused; POST /-/reload does the same.
func TestSIGHUPReloadsKeys(t *testing.T) {
	bin := buildFerry(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "ferry.yaml")
	httpAddr, adminAddr := freeAddr(t), freeAddr(t)
	write := func(id int, key string) {
		cfg := fmt.Sprintf(`exporter: {type: blackhole}
receivers:
  http: {listen: "%s", auth: {mode: required, sources: [header]}}
  otlp: {enabled: false}
  local: {enabled: false}
telemetry: {admin: {listen: "%s"}}
auth: {keys: [{id: %d, secret: "%s", issue: true}]}
`, httpAddr, adminAddr, id, key)
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	issue := func() string {
		out, err := exec.Command(bin, "token", "issue", "-c", file, "--app", "a").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	status := func(tok string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+httpAddr+"/v1/messages/t", strings.NewReader("m"))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("X-Ferry-Token", tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	write(1, strings.Repeat("ab", 32))
	tok1 := issue()
	cmd, logs := runFile(t, bin, file)
	// Ready (the blackhole exporter needs no Kafka): every receiver
	// listens; /healthz answers before they do.
	if !proc.WaitReady(adminAddr, 15*time.Second) {
		t.Fatalf("not ready:\n%s", logs.String())
	}
	if c := status(tok1); c != 200 {
		t.Fatalf("key 1: %d", c)
	}
	write(2, strings.Repeat("cd", 32))
	tok2 := issue()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for status(tok2) != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not load key 2:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c := status(tok1); c != 401 {
		t.Fatalf("key 1 after reload: %d", c)
	}
	// What the ReloadFailing alert (packaging/prometheus) reads.
	metrics := func() string {
		res, err := http.Get("http://" + adminAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	// The reload counts itself just after the new keys take effect, so
	// the counters may trail the first request the new key passes.
	for _, want := range []string{`ferry_config_reloads_total{result="applied"} 1`, `ferry_config_reloads_total{result="refused"} 0`, "ferry_config_last_reload_successful 1"} {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			m := metrics()
			if strings.Contains(m, want+"\n") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after an applied reload, no %s in\n%s", want, m)
			}
		}
	}
	// A broken file is refused over HTTP and the running keys stay.
	if err := os.WriteFile(file, []byte("auth: {keys: [{id: 1, secret: nope}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := http.Post("http://"+adminAddr+"/-/reload", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(body), "auth.keys[0]") {
		t.Fatalf("bad reload: %d %s", res.StatusCode, body)
	}
	if c := status(tok2); c != 200 {
		t.Fatalf("after a refused reload: %d", c)
	}
	for _, want := range []string{`ferry_config_reloads_total{result="applied"} 1`, `ferry_config_reloads_total{result="refused"} 1`, "ferry_config_last_reload_successful 0"} {
		if m := metrics(); !strings.Contains(m, want+"\n") {
			t.Fatalf("after a refused reload, no %s in\n%s", want, m)
		}
	}
}

func TestReloadIsLoopbackOnly(t *testing.T) {
	called := false
	h := reloadHandler(func() (string, error) { called = true; return "", nil })
	req := httptest.NewRequest(http.MethodPost, "/-/reload", nil)
	req.Header.Set("X-Ferry-Reload", "1")
	req.RemoteAddr = "192.0.2.7:5555"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 403 || called {
		t.Fatalf("remote reload: %d, called %v", w.Code, called)
	}
	req.RemoteAddr = "127.0.0.1:5555"
	w = httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != 200 || !called {
		t.Fatalf("loopback reload: %d", w.Code)
	}
}

// TestReloadRefusesBrowsers: what a web page can make a browser send to
// 127.0.0.1 (a simple POST, an Origin header) does not reload.
func TestReloadRefusesBrowsers(t *testing.T) {
	called := false
	h := reloadHandler(func() (string, error) { called = true; return "", nil })
	for name, hdr := range map[string][]string{
		"simple form post":          {"Content-Type", "application/x-www-form-urlencoded"},
		"simple text post":          {"Content-Type", "text/plain"},
		"no header at all":          nil,
		"custom header with Origin": {"X-Ferry-Reload", "1", "Origin", "https://evil.example"},
	} {
		req := httptest.NewRequest(http.MethodPost, "/-/reload", nil)
		req.RemoteAddr = "127.0.0.1:5555"
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 403 || called {
			t.Fatalf("%s: %d, reloaded %v", name, w.Code, called)
		}
	}
}

// TestRelease: make release's script builds a static binary (no ELF
// interpreter: it runs on any Linux of its architecture) whose version
// line names the stamped version, the commit and the Go version.
func TestRelease(t *testing.T) {
	kafkatest.SkipShort(t) // a full build; not a unit test
	out := t.TempDir()
	cmd := exec.Command("../../scripts/release.sh")
	cmd.Env = append(os.Environ(), "VERSION=v9.8.7-test", "PLATFORMS="+runtime.GOOS+"/"+runtime.GOARCH, "OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}
	bin := filepath.Join(out, "ferry-v9.8.7-test-"+runtime.GOOS+"-"+runtime.GOARCH, "ferry")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the release binary is dynamically linked")
		}
	}
	v, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^ferry v9\.8\.7-test \(commit [0-9a-f]{12}(\+changes)?, go1\.\d+`).Match(v) {
		t.Fatalf("version line %q", v)
	}
	if _, err := os.Stat(filepath.Join(out, "SHA256SUMS")); err != nil {
		t.Fatal(err)
	}
}

// TestSteadyMonitor: by default (runtime.monitor_deep_sleep: false) ferry
// run starts itself again in the same process with GODEBUG keeping Go's
// monitor thread on its steady tick, adds it to a GODEBUG the user set, and
// leaves a user's own schedtrace alone; with true it does nothing. The agent serves in every
// case, and the running process's environment is what the kernel shows.
func TestSteadyMonitor(t *testing.T) {
	bin := buildFerry(t)
	for _, c := range []struct {
		name, userGODEBUG string
		sets              []string
		want              string // GODEBUG of the running agent; "" = unset
	}{
		{"default: steady", "", nil, "schedtrace=2147483647"},
		{"user's GODEBUG kept", "gctrace=0", nil, "gctrace=0,schedtrace=2147483647"},
		{"user's schedtrace wins", "schedtrace=0", nil, "schedtrace=0"},
		{"explicit false", "", []string{"runtime.monitor_deep_sleep=false"}, "schedtrace=2147483647"},
		{"true: Go's", "", []string{"runtime.monitor_deep_sleep=true"}, ""},
		{"true: a user's GODEBUG as it is", "gctrace=0", []string{"runtime.monitor_deep_sleep=true"}, "gctrace=0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			admin := freeAddr(t)
			args := []string{"run", "--set", "exporter.type=blackhole", "--set", "receivers.otlp.enabled=false",
				"--set", "receivers.local.enabled=false", "--set", "receivers.http.listen=" + freeAddr(t),
				"--set", "telemetry.admin.listen=" + admin}
			for _, s := range c.sets {
				args = append(args, "--set", s)
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
			if c.userGODEBUG != "" {
				cmd.Env = append(cmd.Env, "GODEBUG="+c.userGODEBUG)
			}
			var logs agenttest.SyncBuffer
			cmd.Stderr = &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				cmd.Wait()
			}()
			if !proc.WaitReady(admin, 15*time.Second) {
				t.Fatalf("not ready:\n%s", logs.String())
			}
			environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, kv := range strings.Split(string(environ), "\x00") {
				if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
					got = v
				}
			}
			if got != c.want {
				t.Fatalf("running agent's GODEBUG %q, want %q", got, c.want)
			}
			if strings.Contains(logs.String(), "could not be applied") {
				t.Fatalf("start again failed:\n%s", logs.String())
			}
		})
	}
}

// TestAdaptiveProcs: the running binary goes to one P while idle; with
// runtime.adaptive_procs false, or GOMAXPROCS in its environment, it keeps
// the scheduler as it is (ferry_runtime_procs on the admin listener). With
// FERRY_REAL_LOAD=1 (make bench) it also goes back to every core while
// clients keep it busy, and to one P again: that needs the agent to get
// close to a whole core of CPU, which a busy machine does not give it, so
// make test leaves it to the scheduler package's test, which drives the
// Controller with a load of its own making.
func TestAdaptiveProcs(t *testing.T) {
	// "Every core" is Go's default, which follows a container's CPU limit:
	// this test process's own GOMAXPROCS, unless the environment set it.
	max := runtime.GOMAXPROCS(0)
	if os.Getenv("GOMAXPROCS") != "" {
		max = runtime.NumCPU()
	}
	if max < 2 {
		t.Skip("one core: nothing to adapt")
	}
	bin := buildFerry(t)
	base := []string{"exporter.type=blackhole", "receivers.otlp.enabled=false", "receivers.local.enabled=false"}
	wait := func(t *testing.T, a *agenttest.Agent, what string, want float64, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for a.Metric("ferry_runtime_procs") != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: ferry_runtime_procs %v after %v, want %v", what, a.Metric("ferry_runtime_procs"), d, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Run("idle", func(t *testing.T) {
		t.Setenv("GOMAXPROCS", "")
		a := agenttest.Start(t, bin, "", base...)
		wait(t, a, "idle", 1, 10*time.Second)
		if n := a.Metric("ferry_runtime_procs_changes_total"); n != 1 {
			t.Fatalf("%v changes counted, want 1", n)
		}
	})
	t.Run("follows the load", func(t *testing.T) {
		if os.Getenv("FERRY_REAL_LOAD") != "1" {
			t.Skip("needs a whole core of CPU for the agent: FERRY_REAL_LOAD=1 (make bench)")
		}
		t.Setenv("GOMAXPROCS", "")
		a := agenttest.Start(t, bin, "", base...)
		wait(t, a, "idle", 1, 10*time.Second)
		// Clients posting gzip'd batches of 4,000 messages as fast as
		// answered: little work for them (even under -race), much for the
		// agent, which inflates and splits 1 MB per request.
		var batch bytes.Buffer
		zw := gzip.NewWriter(&batch)
		for i := range 4000 {
			fmt.Fprintf(zw, "{\"m\":%d,\"v\":%q}\n", i, bytes.Repeat([]byte("x"), 240))
		}
		zw.Close()
		stop := make(chan struct{})
		var clients sync.WaitGroup
		var answered atomic.Int64
		for range 4 {
			clients.Add(1)
			go func() {
				defer clients.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest("POST", "http://"+a.HTTP+"/v1/messages/t", bytes.NewReader(batch.Bytes()))
					req.Header.Set("Content-Type", "application/x-ndjson")
					req.Header.Set("Content-Encoding", "gzip")
					res, err := http.DefaultClient.Do(req)
					if err == nil {
						if res.StatusCode == http.StatusOK {
							answered.Add(1)
						}
						io.Copy(io.Discard, res.Body)
						res.Body.Close()
					}
				}
			}()
		}
		wait(t, a, "busy", float64(max), 30*time.Second)
		close(stop)
		clients.Wait()
		if answered.Load() == 0 {
			t.Fatal("no batch was accepted: the load was not the agent's work")
		}
		wait(t, a, "idle again", 1, 10*time.Second)
		if n := a.Metric("ferry_runtime_procs_changes_total"); n < 3 {
			t.Fatalf("%v changes counted, want at least 3", n)
		}
	})
	for _, c := range []struct {
		name, env string
		sets      []string
		want      float64
	}{
		{"off", "", []string{"runtime.adaptive_procs=false"}, float64(max)},
		{"GOMAXPROCS in the environment", "2", nil, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", c.env)
			a := agenttest.Start(t, bin, "", append(base, c.sets...)...)
			time.Sleep(2 * time.Second) // twice the light spell that goes to one P
			if got := a.Metric("ferry_runtime_procs"); got != c.want {
				t.Fatalf("ferry_runtime_procs %v, want %v", got, c.want)
			}
			if n := a.Metric("ferry_runtime_procs_changes_total"); n != 0 {
				t.Fatalf("%v changes", n)
			}
		})
	}
}
