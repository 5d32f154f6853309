package soak

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// ---- a TCP proxy between clients and the agent ----

// proxy forwards every connection to the agent's current address (the
// agent may be restarted on new ports behind it) and can cut them all.
type proxy struct {
	ln       net.Listener
	upstream atomic.Pointer[string]
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	cuts     atomic.Int64
}

func newProxy(t *testing.T) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) point(to string) { p.upstream.Store(&to) }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

func (p *proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) pipe(c net.Conn) {
	defer c.Close()
	up := p.upstream.Load()
	if up == nil {
		return
	}
	u, err := net.DialTimeout("tcp", *up, 2*time.Second)
	if err != nil {
		return // the agent is down: the client sees its connection closed
	}
	defer u.Close()
	p.track(c, true)
	p.track(u, true)
	defer p.track(c, false)
	defer p.track(u, false)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
}

// cut resets every open connection, both legs, wherever its requests are.
func (p *proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN: a connection cut, not closed
		}
		c.Close()
		n++
	}
	p.cuts.Add(int64(n))
	return n
}

// ---- the spool's own disk ----

// spoolDisk is a tmpfs of size MiB mounted on dir (root only), so that
// filling it runs the spool out of space and nothing else.
type spoolDisk struct {
	dir    string
	mb     int
	filler string
	why    string // why there is none ("" if mounted)
}

func mountSpool(t *testing.T, dir string, mb int) *spoolDisk {
	t.Helper()
	d := &spoolDisk{dir: dir, mb: mb, filler: filepath.Join(dir, "soak-disk-filler")}
	if os.Geteuid() != 0 {
		d.why = "spool-full skipped: a disk of its own for the spool is a tmpfs, and mounting one needs root"
		return d
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", mb), "tmpfs", dir).CombinedOutput(); err != nil {
		d.why = fmt.Sprintf("spool-full skipped: mount tmpfs failed: %v %s", err, strings.TrimSpace(string(out)))
		return d
	}
	t.Cleanup(func() {
		for i := 0; i < 50; i++ {
			if exec.Command("umount", dir).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // an agent being killed may still hold files
		}
		_ = exec.Command("umount", "-l", dir).Run()
	})
	return d
}

// fill takes every free byte of the spool's disk.
func (d *spoolDisk) fill() error {
	f, err := os.Create(d.filler)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}

func (d *spoolDisk) free() error { return os.Remove(d.filler) }

// ---- network delay and loss towards the brokers ----

// netem puts delay and loss on the packets sent to the brokers' ports over
// lo (the agent's produce requests and the brokers' replication alike;
// nothing else on the machine): a prio qdisc whose third band is a netem,
// and u32 filters sending the brokers' destination ports there.
type netem struct {
	ports []int
	why   string // why it is skipped ("" if available)
}

func probeNetem(ports []int) *netem {
	n := &netem{ports: ports}
	if os.Geteuid() != 0 {
		n.why = "netem skipped: changing lo's queueing discipline needs root"
		return n
	}
	for _, tool := range []string{"tc", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			n.why = "netem skipped: no " + tool + " (scripts/soak.sh deps installs iproute2)"
			return n
		}
	}
	// Try both qdiscs in a namespace of its own, not on the machine's lo.
	ns := fmt.Sprintf("ferry-soak-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		n.why = fmt.Sprintf("netem skipped: ip netns add: %v %s", err, strings.TrimSpace(string(out)))
		return n
	}
	defer exec.Command("ip", "netns", "del", ns).Run()
	for _, q := range [][]string{{"prio"}, {"netem", "delay", "1ms"}} {
		args := append([]string{"netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root"}, q...)
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			n.why = fmt.Sprintf("netem skipped: this kernel has no %s qdisc (tc: %s)", q[0], strings.TrimSpace(string(out)))
			return n
		}
		_ = exec.Command("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root").Run()
	}
	return n
}

func (n *netem) on(delay time.Duration, lossPct int) error {
	cmds := [][]string{
		{"qdisc", "add", "dev", "lo", "root", "handle", "1:", "prio"},
		{"qdisc", "add", "dev", "lo", "parent", "1:3", "handle", "30:", "netem",
			"delay", fmt.Sprintf("%dms", delay.Milliseconds()), fmt.Sprintf("%dms", delay.Milliseconds()/4), "loss", fmt.Sprintf("%d%%", lossPct)},
	}
	for _, p := range n.ports {
		cmds = append(cmds, []string{"filter", "add", "dev", "lo", "protocol", "ip", "parent", "1:0", "prio", "3", "u32",
			"match", "ip", "dport", fmt.Sprint(p), "0xffff", "flowid", "1:3"})
	}
	for _, c := range cmds {
		if out, err := exec.Command("tc", c...).CombinedOutput(); err != nil {
			n.off()
			return fmt.Errorf("tc %s: %v %s", strings.Join(c, " "), err, out)
		}
	}
	return nil
}

func (n *netem) off() { _ = exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run() }

// ---- the scheduler ----

var faultKinds = []string{"agent-kill", "broker-kill", "broker-pause", "cut", "spool-full", "rotate", "netem"}

// fault is one kind of fault: run injects it, waits its length and undoes
// it, all within the call; it returns what it did, for the log.
type fault struct {
	kind string
	run  func(r *rand.Rand) (string, error)
}

// schedule injects faults drawn from r, one at a time with gaps of gap[0]
// to gap[1], until stop is closed; a fault under way is finished (undone)
// before it returns. It counts what it injected in counts.
func schedule(t *testing.T, r *rand.Rand, faults []fault, gap [2]time.Duration, stop <-chan struct{}, counts *sync.Map, logf func(string, ...any)) error {
	for {
		wait := gap[0] + time.Duration(r.Int64N(int64(gap[1]-gap[0])+1))
		select {
		case <-stop:
			return nil
		case <-time.After(wait):
		}
		f := faults[r.IntN(len(faults))]
		start := time.Now()
		what, err := f.run(r)
		if err != nil {
			return fmt.Errorf("fault %s: %w", f.kind, err)
		}
		v, _ := counts.LoadOrStore(f.kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		logf("fault %s: %s (%.1fs)", f.kind, what, time.Since(start).Seconds())
	}
}

func sleepRand(r *rand.Rand, lo, hi time.Duration) time.Duration {
	d := lo + time.Duration(r.Int64N(int64(hi-lo)+1))
	time.Sleep(d)
	return d
}
