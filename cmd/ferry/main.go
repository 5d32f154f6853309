// Command ferry is the host agent: it takes what the programs of a host
// send it (messages and NDJSON over HTTP, OpenTelemetry over OTLP, its own
// local protocol, unmodified Kafka producers through its Kafka front) and
// forwards it to Apache Kafka, answering each client only once its records
// are durable (Kafka's acknowledgement, or the fsync'd spool).
//
//	ferry run [-c ferry.yaml] [--set key.path=value ...]
//	ferry validate [-c ferry.yaml] [--set ...]
//	ferry config default
//	ferry token keygen|issue|inspect ...   (docs/tokens.md)
//	ferry spool inspect|verify|dump ...    (docs/operating.md)
//	ferry deadletter replay ...            (docs/operating.md)
//	ferry top [--admin HOST:PORT] [--once] (docs/operating.md)
//	ferry version
//
// The agent itself is package pipeline; this command reads the config,
// sizes the scheduler (package scheduler here), reloads on SIGHUP and on
// the admin listener's /-/reload, and hands a memfd of its config to itself
// when it re-executes (inherit_linux.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/cmd/ferry/scheduler"
	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/pipeline"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

const usage = `ferry — a local telemetry agent that forwards to Apache Kafka

Usage:
  ferry run [-c FILE] [--set key.path=value ...]   run the agent (built-in defaults without -c)
  ferry validate [-c FILE] [--set ...]              check a configuration and the files it names
  ferry config default                              print the complete default configuration
  ferry token keygen|issue|inspect                  application tokens (ferry token for help)
  ferry spool inspect|verify|dump                   a stopped agent's disk spool (ferry spool for help)
  ferry deadletter replay --rate N                  send dead letters to Kafka again (ferry deadletter for help)
  ferry top [--admin HOST:PORT] [--once]            a running agent's live view: rates, refusals, apps, Kafka
  ferry version                                     print the version
`

type sets []string

func (s *sets) String() string     { return fmt.Sprint(*s) }
func (s *sets) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "version", "--version", "-v":
		fmt.Println(versionLine())
		return 0
	case "config":
		if len(args) == 2 && args[1] == "default" {
			os.Stdout.Write(config.DefaultYAML())
			return 0
		}
		fmt.Fprintln(os.Stderr, "usage: ferry config default")
		return 2
	case "run", "validate":
		fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
		file := fs.String("c", "", "configuration file (YAML)")
		fs.StringVar(file, "config", "", "configuration file (YAML)")
		var s sets
		fs.Var(&s, "set", "override one key: key.path=value (repeatable)")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		raw, err := readConfig(*file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry:", err)
			return 1
		}
		cfg, err := config.LoadSource(*file, raw, s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry:", err)
			return 1
		}
		if args[0] == "validate" {
			if err := checkFiles(cfg); err != nil {
				fmt.Fprintln(os.Stderr, "ferry:", err)
				return 1
			}
			if err := checkSpool(cfg, os.Stdout, os.Stderr); err != nil {
				fmt.Fprintln(os.Stderr, "ferry:", err)
				return 1
			}
			for _, w := range cfg.Warnings() {
				fmt.Fprintln(os.Stderr, "ferry: warning:", w)
			}
			fmt.Println("configuration is valid")
			return 0
		}
		var restartErr error
		if !cfg.Runtime.MonitorDeepSleep {
			// Returns only if it could not start again.
			restartErr = steadyMonitor(*file, raw)
		}
		return serve(cfg, restartErr, func() (*config.Config, error) { return config.Load(*file, s) })
	case "token":
		return tokenCmd(args[1:])
	case "spool":
		return spoolCmd(args[1:], os.Stdout, os.Stderr)
	case "deadletter":
		return deadletterCmd(args[1:], os.Stdout, os.Stderr)
	case "top":
		return topCmd(args[1:], os.Stdout, os.Stderr)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "ferry: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// serve runs the agent until SIGTERM/SIGINT. SIGHUP and POST /-/reload on
// the admin listener re-read the configuration with load and apply what can
// change while running.
func serve(cfg *config.Config, restartErr error, load func() (*config.Config, error)) int {
	set := telemetry.NewSettings(cfg.Telemetry.Config, os.Stderr)
	if restartErr != nil {
		set.Logger.Warn("runtime.monitor_deep_sleep: false (the default) could not be applied; running with Go's own monitor behaviour", "err", restartErr)
	}
	for _, w := range cfg.Warnings() {
		set.Logger.Warn(w, "component", "config")
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// The data ferry holds is bounded by memory_limit, but Go's collector
		// by default lets the heap grow to twice what is live before it
		// collects. A soft limit just above the data bound keeps the process
		// near it: 32 MiB for the runtime, pools and listeners, which with
		// the binary's resident code (~17 MiB, outside Go's accounting)
		// keeps the whole process within memory_limit + 64 MiB even right
		// after a burst of hostile requests (hostile/).
		soft := int64(cfg.Queue.MemoryLimit) + 32<<20
		debug.SetMemoryLimit(soft)
		set.Logger.Debug("Go soft memory limit set", "bytes", soft)
	}
	p, err := pipeline.New(cfg, set)
	if err != nil {
		set.Logger.Error("cannot build the pipeline", "err", err)
		return 1
	}
	// A refused reload leaves the agent running on the old configuration
	// with nothing but a log line to say so: the counter and the gauge let
	// an alert see it (packaging/prometheus).
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_config_reloads_total",
		Help: "Configuration reloads (SIGHUP, POST /-/reload) by result: applied, or refused (the running configuration stays)."}, []string{"result"})
	lastReloadOK := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_config_last_reload_successful",
		Help: "1 if the last reload was applied (or none was asked since start), 0 if it was refused."})
	set.Registry.MustRegister(reloads, lastReloadOK)
	reloads.WithLabelValues("applied")
	reloads.WithLabelValues("refused")
	lastReloadOK.Set(1)
	reload := func() (string, error) {
		next, err := load()
		if err == nil {
			var warning string
			if warning, err = p.Reload(next); err == nil {
				for _, w := range next.Warnings() {
					set.Logger.Warn(w, "component", "config")
					warning = strings.TrimPrefix(warning+"; "+w, "; ")
				}
				reloads.WithLabelValues("applied").Inc()
				lastReloadOK.Set(1)
				return warning, nil
			}
		}
		set.Logger.Error("reload refused: the running configuration stays", "err", err)
		reloads.WithLabelValues("refused").Inc()
		lastReloadOK.Set(0)
		return "", err
	}
	p.Admin.Handle("POST /-/reload", reloadHandler(reload))
	// Caught from before the receivers open, handled once they are: a
	// SIGHUP sent as soon as the agent says it started (or /readyz says
	// ready) reloads rather than kills it, and a SIGTERM during start-up
	// stops it gracefully once started.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if err := p.Start(context.Background()); err != nil {
		signal.Stop(hup)
		signal.Stop(sig)
		set.Logger.Error("cannot start", "err", err)
		return 1
	}
	procs := scheduler.New(scheduler.Config{Adaptive: cfg.Runtime.AdaptiveProcs}, set.Logger, set.Registry)
	_ = procs.Start(context.Background()) // it cannot fail: off, kept or sampling
	defer procs.Shutdown(context.Background())
	go func() {
		for range hup {
			_, _ = reload()
		}
	}()
	s := <-sig
	set.Logger.Info("stopping: no new requests; flushing to Kafka", "signal", s.String(), "timeout", cfg.ShutdownTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	go func() {
		// A second signal means "now": exit without waiting for Kafka.
		s := <-sig
		set.Logger.Error("second signal: exiting without flushing", "signal", s.String())
		os.Exit(1)
	}()
	if err := p.Shutdown(ctx); err != nil {
		set.Logger.Error("shutdown incomplete", "err", err)
		return 1
	}
	return 0
}

// reloadHandler serves POST /-/reload, from loopback clients only.
func reloadHandler(reload func() (string, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": "reload is allowed from loopback only"})
			return
		}
		// A web page can make the browser send a simple POST to loopback;
		// it cannot add a custom header or a JSON content type without a
		// CORS preflight, which nothing here answers.
		ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if r.Header.Get("Origin") != "" || r.Header.Get("X-Ferry-Reload") == "" && ct != "application/json" {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": "reload needs the header X-Ferry-Reload: 1 (or Content-Type: application/json) and no Origin: e.g. curl -XPOST -H 'X-Ferry-Reload: 1' http://127.0.0.1:8089/-/reload"})
			return
		}
		warning, err := reload()
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]any{"reloaded": false, "error": err.Error()})
			return
		}
		out := map[string]any{"reloaded": true}
		if warning != "" {
			out["warning"] = warning
		}
		_ = json.NewEncoder(w).Encode(out)
	})
}

// buildCommit is stamped by make release (-X main.buildCommit=...): Go's
// own VCS stamp is off where GOFLAGS has -buildvcs=false.
var buildCommit string

// versionLine is what ferry version prints: the version stamped at build
// time (make release), the commit and whether the tree had changes (from
// Go's build information), and the Go version and platform.
func versionLine() string {
	commit, modified := "unknown", ""
	if buildCommit != "" {
		commit, modified = buildCommit, ""
	} else if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && len(s.Value) >= 12:
				commit = s.Value[:12]
			case s.Key == "vcs.modified" && s.Value == "true":
				modified = "+changes"
			}
		}
	}
	return fmt.Sprintf("ferry %s (commit %s%s, %s %s/%s)", pipeline.Version, commit, modified, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// checkFiles reads the files the configuration names (TLS certificates,
// keys and CAs, SASL secrets) as start-up would, without binding or
// creating anything, so a configuration that validates also starts.
func checkFiles(cfg *config.Config) error {
	var err error
	cfg.Receivers.Each(func(f receiver.Factory, rc receiver.Config) {
		if err == nil && rc.On() {
			if ferr := rc.CheckFiles(); ferr != nil {
				err = fmt.Errorf("receivers.%s: %w", f.Type(), ferr)
			}
		}
	})
	if err != nil {
		return err
	}
	typ := cfg.Exporter.Type
	if err := cfg.Exporter.Config(typ).CheckFiles(); err != nil {
		return fmt.Errorf("exporter.%s: %w", typ, err)
	}
	return nil
}

// checkSpool reads the spool the configuration would open (delivery modes
// spool and spill), as ferry spool verify does, and says what the next
// start will do with it. Damage is a warning: the agent starts, truncating
// or skipping it (and the records in it are lost); only a spool it could
// not open is an error. A spool a running agent holds is not read.
func checkSpool(cfg *config.Config, stdout, stderr io.Writer) error {
	if cfg.Delivery.Mode != "spool" && cfg.Delivery.Mode != "spill" {
		return nil
	}
	dir := cfg.Delivery.Spool.Dir
	rep, err := spool.Inspect(dir, spool.ReadOptions{MaxRecordBytes: int(cfg.SpoolRecordBytes())})
	switch {
	case errors.Is(err, spool.ErrNoSpool):
		fmt.Fprintf(stdout, "spool %s: none yet (created at start)\n", dir)
		return nil
	case errors.Is(err, spool.ErrInUse):
		fmt.Fprintf(stdout, "spool %s: in use by a running ferry, not read (ferry spool verify --force reads it)\n", dir)
		return nil
	case err != nil:
		return fmt.Errorf("delivery.spool.dir: %w", err)
	}
	fmt.Fprintf(stdout, "spool %s: %d segments; a start replays %d records (%s)\n", dir, len(rep.Segments), rep.ReplayRecords, human(rep.ReplayBytes))
	if rep.CheckpointError != "" {
		fmt.Fprintf(stderr, "ferry: warning: spool %s: checkpoint unreadable (%s): a start replays every segment from its start\n", dir, rep.CheckpointError)
	}
	if rep.Damaged() {
		fmt.Fprintf(stderr, "ferry: warning: spool %s: %s; the agent starts all the same (ferry spool verify lists them)\n", dir, damageLine(rep))
	}
	return nil
}

// steadyMonitorGODEBUG keeps Go's monitor thread (sysmon) out of its deep
// sleep. Go reads it only when a process starts; a schedtrace period of
// 2^31-1 ms prints a line only every 24.8 days of uptime.
const steadyMonitorGODEBUG = "schedtrace=2147483647"

// steadyMonitor starts ferry again, in this process (same PID, same
// arguments), with steadyMonitorGODEBUG added to GODEBUG, unless GODEBUG
// already sets schedtrace (this is the second start, or the user chose).
// The configuration file's bytes, already read, go to the new start with
// it (inheritConfig): the file may be a pipe (-c /dev/stdin, -c <(...))
// that cannot be read twice.
// Why (runtime.monitor_deep_sleep in default.yaml): after every idle spell
// Go's monitor polls every 20 µs, and an agent under a trickle of requests
// is idle hundreds of times a second, so it polls almost always; each
// timed sleep costs tens of µs of CPU on a virtual machine.
// It returns only when the new start failed, with the reason.
func steadyMonitor(file string, raw []byte) error {
	env := os.Environ()
	godebug, at := "", -1
	for i, kv := range env {
		// The first GODEBUG is the one Go reads.
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug, at = v, i
			break
		}
	}
	for _, f := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(f), "schedtrace=") {
			return nil
		}
	}
	if godebug != "" {
		godebug += ","
	}
	godebug = "GODEBUG=" + godebug + steadyMonitorGODEBUG
	if at >= 0 {
		env[at] = godebug
	} else {
		env = append(env, godebug)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if file != "" {
		f, err := inheritConfig(raw)
		if err != nil {
			return fmt.Errorf("keeping the configuration for the new start: %w", err)
		}
		defer f.Close() // only reached if Exec failed
		env = append(env, fmt.Sprintf("%s=%d", inheritedFDEnv, f.Fd()), inheritedPathEnv+"="+file)
	}
	return syscall.Exec(exe, os.Args, env)
}

// The environment by which a re-executed ferry finds the configuration
// bytes its first start read: an open file descriptor, and the path it was
// read from (used only when the new start is asked for that same path).
const (
	inheritedFDEnv   = "FERRY_INHERITED_CONFIG_FD"
	inheritedPathEnv = "FERRY_INHERITED_CONFIG_PATH"
)

// readConfig reads the configuration file at path ("" for none): the bytes
// the first start of this process read, when it handed them over, else the
// file. The hand-over is used once and removed from the environment, so a
// reload reads the file again.
func readConfig(path string) ([]byte, error) {
	fdText, inherited := os.LookupEnv(inheritedFDEnv)
	from := os.Getenv(inheritedPathEnv)
	os.Unsetenv(inheritedFDEnv)
	os.Unsetenv(inheritedPathEnv)
	if path == "" {
		return nil, nil
	}
	if inherited && from == path {
		if fd, err := strconv.Atoi(fdText); err == nil && fd > 2 {
			f := os.NewFile(uintptr(fd), path)
			defer f.Close()
			b, err := io.ReadAll(f)
			if err != nil {
				return nil, fmt.Errorf("%s: reading the configuration the first start read: %w", path, err)
			}
			return b, nil
		}
	}
	return config.ReadFile(path)
}
