package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/status"
)

const topUsage = `usage: ferry top [--admin HOST:PORT | -c FILE [--set ...]] [--once] [--width N] [--interval D]

A live view of a running agent, read from GET /status on its admin listener
(docs/operating.md): rates per receiver and topic, refusals by reason, token
applications, queue and spool fill, Kafka latency, dead letters, file lag.
Redraws every second in the terminal's alternate screen; q or Ctrl-C quits.
--once prints one frame as plain text (every row) and exits: for scripts.
`

// maxStatusBytes bounds what top reads of an answer: a report lists at most
// 50 rows a table and two minutes of history, far below it.
const maxStatusBytes = 8 << 20

func topCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, topUsage); fs.PrintDefaults() }
	admin := fs.String("admin", "", "the agent's admin address (default: telemetry.admin.listen of -c, or of the default configuration)")
	file := fs.String("c", "", "read the admin address from this configuration file")
	fs.StringVar(file, "config", "", "read the admin address from this configuration file")
	var s sets
	fs.Var(&s, "set", "override one key of the configuration: key.path=value (repeatable)")
	once := fs.Bool("once", false, "print one frame as plain text and exit")
	width := fs.Int("width", 0, "columns of --once's frame (default: the terminal's, or 120)")
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *interval < 100*time.Millisecond {
		fs.Usage()
		return 2
	}
	addr := *admin
	if addr == "" {
		cfg, err := config.Load(*file, s)
		if err != nil {
			fmt.Fprintln(stderr, "ferry:", err)
			return 1
		}
		if cfg.Telemetry.Admin.TLS.CertFile != "" {
			fmt.Fprintln(stderr, "ferry: top speaks plain HTTP and this admin listener uses TLS: give --admin an address without TLS")
			return 1
		}
		addr = dialable(cfg.Telemetry.Admin.Listen)
	}
	c := &topClient{url: "http://" + addr + "/status?history=120", http: &http.Client{Timeout: 2 * time.Second}}
	if *once {
		r, err := c.fetch()
		if err != nil {
			fmt.Fprintln(stderr, "ferry:", err)
			return 1
		}
		w := *width
		if w <= 0 {
			if w, _ = termSize(os.Stdout); w <= 0 {
				w = 120
			}
		}
		// Every row: a script reads them all (the agent lists at most 50 a table).
		for _, l := range status.Frame(r, addr, w, 1000) {
			fmt.Fprintln(stdout, l)
		}
		return 0
	}
	return c.live(addr, *interval, stdout, stderr)
}

// dialable turns a listen address into one to connect to: an unspecified
// host (":8089", "0.0.0.0:8089") is this host's loopback.
func dialable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return net.JoinHostPort(host, port)
}

type topClient struct {
	url  string
	http *http.Client
}

func (c *topClient) fetch() (*status.Report, error) {
	res, err := c.http.Get(c.url)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the agent's admin listener: %w", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxStatusBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", c.url, err)
	}
	if len(body) > maxStatusBytes {
		return nil, fmt.Errorf("%s answered more than %d bytes", c.url, maxStatusBytes)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", c.url, res.Status, strings.TrimSpace(string(body)))
	}
	var r status.Report
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: not a status report: %w", c.url, err)
	}
	return &r, nil
}

// live redraws every interval until q, Ctrl-C or SIGTERM. Plain ANSI
// escapes: the alternate screen (the shell's screen comes back at exit),
// cursor home and erase, no mouse; keys are read unbuffered and unechoed,
// with the terminal's own Ctrl-C kept.
func (c *topClient) live(addr string, interval time.Duration, stdout, stderr io.Writer) int {
	restore, err := rawInput(os.Stdin)
	if err != nil {
		fmt.Fprintln(stderr, "ferry: top needs a terminal (use --once in scripts):", err)
		return 1
	}
	defer restore()
	fmt.Fprint(stdout, "\x1b[?1049h\x1b[?25l")
	defer fmt.Fprint(stdout, "\x1b[?25h\x1b[?1049l")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	keys := make(chan byte, 16)
	go func() {
		b := make([]byte, 16)
		for {
			n, err := os.Stdin.Read(b)
			for _, k := range b[:n] {
				select {
				case keys <- k:
				default:
				}
			}
			if err != nil {
				close(keys)
				return
			}
		}
	}()
	reports := make(chan result, 1)
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			r, err := c.fetch()
			select {
			case reports <- result{r, err}:
			case <-ctx.Done():
				return
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	var last *status.Report
	var lastErr error
	draw := func() {
		w, h := termSize(os.Stdout)
		if w <= 0 || h <= 0 {
			w, h = 80, 24
		}
		var lines []string
		switch {
		case last == nil && lastErr != nil:
			lines = []string{"ferry top: " + lastErr.Error(), "retrying every " + interval.String() + "; q quits"}
		case last == nil:
			lines = []string{"ferry top: asking " + addr + " ..."}
		default:
			fh := h
			if lastErr != nil {
				fh--
			}
			lines = status.Frame(last, addr, w, fh)
			if lastErr != nil {
				lines = append([]string{clipLine("STALE: "+lastErr.Error(), w)}, lines...)
			}
		}
		var b strings.Builder
		b.WriteString("\x1b[H")
		for i, l := range lines {
			if i > 0 {
				b.WriteString("\r\n")
			}
			b.WriteString(l)
			b.WriteString("\x1b[K")
		}
		b.WriteString("\x1b[J")
		_, _ = io.WriteString(stdout, b.String())
	}
	for {
		select {
		case <-ctx.Done():
			return 0
		case k, ok := <-keys:
			if !ok || k == 'q' || k == 'Q' || k == 3 || k == 4 {
				return 0
			}
		case <-winch:
			draw()
		case r := <-reports:
			if r.err != nil {
				lastErr = r.err
			} else {
				last, lastErr = r.r, nil
			}
			draw()
		}
	}
}

type result struct {
	r   *status.Report
	err error
}

func clipLine(s string, w int) string {
	if r := []rune(s); len(r) > w {
		return string(r[:w])
	}
	return s
}

var errNotTerminal = errors.New("standard input is not a terminal")
