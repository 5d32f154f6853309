// Package proc owns what the measuring commands (the suite, the fleet) need
// of the processes they start: their CPU time and peak memory from /proc,
// waiting for an agent to be ready, and stopping it.
package proc

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Ticks is the CPU time (user + system, in clock ticks) of the processes;
// processes that are gone count 0.
func Ticks(pids ...int) int64 {
	var sum int64
	for _, pid := range pids {
		t, _ := CPUTicks(pid)
		sum += t
	}
	return sum
}

// CPUTicks is one process's CPU time (user + system, in clock ticks);
// false if it is gone.
func CPUTicks(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Fields after the command name (which may hold spaces): utime is the
	// 14th, stime the 15th overall.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st, true
}

// ClkTck is the number of clock ticks per second (asked once).
var ClkTck = sync.OnceValue(func() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if v, err2 := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && err2 == nil && v > 0 {
		return v
	}
	return 100
})

// StatusKB reads a kB field of /proc/PID/status (VmRSS, VmHWM); 0 if the
// process is gone or has no such field.
func StatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb
			}
		}
	}
	return 0
}

// WaitReady polls http://admin/readyz until it answers 200 or wait passes.
func WaitReady(admin string, wait time.Duration) bool {
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if res, err := http.Get("http://" + admin + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return true
			}
		}
	}
	return false
}

// Stop sends SIGTERM, and SIGKILL if the process has not exited within
// grace; it returns once the process is reaped.
func Stop(cmd *exec.Cmd, grace time.Duration) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}
