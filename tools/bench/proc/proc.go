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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
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

// Switches is how many times the process's threads have been switched off
// a CPU (voluntary and involuntary context switches, summed over
// /proc/PID/task/*/status). A thread that wakes to do a little work and
// sleeps again costs a switch each way, and on a virtual machine a switch
// can cost more CPU than the work: this is what shows it. Threads that
// exited take their counts with them; the Go runtime keeps its threads.
func Switches(pid int) int64 {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var sum int64
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, d.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				sum += n
			} else if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				sum += n
			}
		}
	}
	return sum
}

// SwitchCost measures what one thread switch costs in CPU on this machine:
// two threads hand a byte back and forth over a pair of pipes for d, each
// blocking in the kernel between turns, so every turn is one switch off and
// one switch on. It returns the process's CPU time per switch and the
// number of switches made. Raw system calls keep the Go scheduler out of
// the measurement (no hand-off of the thread's P, no wake-ups of its own).
func SwitchCost(d time.Duration) (cpuPerSwitch time.Duration, switches int64, err error) {
	// Each side holds a P while it blocks: with one P the other side could
	// never run.
	if runtime.GOMAXPROCS(0) < 2 {
		return 0, 0, fmt.Errorf("switch cost: needs GOMAXPROCS >= 2, have %d", runtime.GOMAXPROCS(0))
	}
	var ab, ba [2]int
	if err := syscall.Pipe(ab[:]); err != nil {
		return 0, 0, err
	}
	if err := syscall.Pipe(ba[:]); err != nil {
		syscall.Close(ab[0])
		syscall.Close(ab[1])
		return 0, 0, err
	}
	defer func() {
		for _, fd := range []int{ab[0], ab[1], ba[0], ba[1]} {
			syscall.Close(fd)
		}
	}()
	// One side echoes until its pipe closes; the other counts round trips.
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b := []byte{0}
		for {
			if n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(ab[0]), uintptr(unsafe.Pointer(&b[0])), 1); n != 1 || e != 0 {
				return
			}
			if n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(ba[1]), uintptr(unsafe.Pointer(&b[0])), 1); n != 1 || e != 0 {
				return
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b := []byte{0}
	var trips int64
	for start := time.Now(); time.Since(start) < d; {
		for range 256 {
			if n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(ab[1]), uintptr(unsafe.Pointer(&b[0])), 1); n != 1 || e != 0 {
				return 0, 0, fmt.Errorf("switch cost: write: %v", e)
			}
			if n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(ba[0]), uintptr(unsafe.Pointer(&b[0])), 1); n != 1 || e != 0 {
				return 0, 0, fmt.Errorf("switch cost: read: %v", e)
			}
		}
		trips += 256
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	syscall.Close(ab[1])
	ab[1] = -1
	<-echoed
	cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) +
		syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
	switches = 2 * trips
	return cpu / time.Duration(switches), switches, nil
}

// SleepCost measures what a short timed sleep costs in CPU on this
// machine: one thread sleeps 20 µs at a time for d, as Go's monitor thread
// does after every idle spell (runtime.monitor_deep_sleep). On a virtual
// machine arming the timer and being woken by it can cost more than the
// sleep. It returns the thread's CPU time per sleep and the sleeps made.
func SleepCost(d time.Duration) (cpuPerSleep time.Duration, sleeps int64, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ts := syscall.Timespec{Nsec: 20_000}
	var ru0, ru1 syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru0); err != nil {
		return 0, 0, err
	}
	for start := time.Now(); time.Since(start) < d; sleeps++ {
		// Raw: the Go scheduler does not hand this thread's P away meanwhile.
		syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru1); err != nil {
		return 0, 0, err
	}
	cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) +
		syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
	return cpu / time.Duration(max(sleeps, 1)), sleeps, nil
}
