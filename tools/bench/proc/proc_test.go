package proc

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

func TestTicksAndMemoryOfARealProcess(t *testing.T) {
	// This process has spent some CPU by now; a busy loop makes sure.
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	if Ticks(os.Getpid()) <= 0 {
		t.Fatal("no CPU time read for this process")
	}
	if Ticks(-1) != 0 {
		t.Fatal("a process that does not exist has CPU time")
	}
	if StatusKB(os.Getpid(), "VmHWM") <= 0 {
		t.Fatal("no peak RSS read for this process")
	}
	if ClkTck() <= 0 {
		t.Fatal("no clock tick rate")
	}
}

func TestStopEndsAProcessThatIgnoresSIGTERM(t *testing.T) {
	cmd := exec.Command("sh", "-c", "trap '' TERM; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	Stop(cmd, 300*time.Millisecond)
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Stop took %s", el)
	}
	if cmd.ProcessState == nil {
		t.Fatal("the process was not reaped")
	}
}

// TestSwitches: a child that sleeps 50 times in a row is switched off its
// CPU at least 50 times; a process that does not exist has none.
func TestSwitches(t *testing.T) {
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 50 ]; do sleep 0.01; i=$((i+1)); done; read x")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer in.Close()
	// sh waits for each sleep child: one switch off per wait at least.
	deadline := time.Now().Add(10 * time.Second)
	for Switches(cmd.Process.Pid) < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("%d switches after the sleeps", Switches(cmd.Process.Pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if Switches(-1) != 0 {
		t.Fatal("a process that does not exist has switches")
	}
}

// TestSwitchCost: the ping-pong makes switches (thousands when the machine
// is not busy with other tests) and prices each at a positive CPU time
// below a millisecond.
func TestSwitchCost(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		if _, _, err := SwitchCost(time.Millisecond); err == nil {
			t.Fatal("one P: no error")
		}
		t.Skip("needs two Ps")
	}
	cost, n, err := SwitchCost(200 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d switches, %v CPU each", n, cost)
	if n < 100 || cost <= 0 || cost > time.Millisecond {
		t.Fatalf("%d switches at %v each", n, cost)
	}
}

// TestSleepCost: 20 µs sleeps (thousands when the machine is not busy with
// other tests), each priced at a positive CPU time below a millisecond.
func TestSleepCost(t *testing.T) {
	cost, n, err := SleepCost(200 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d sleeps, %v CPU each", n, cost)
	if n < 50 || cost <= 0 || cost > time.Millisecond {
		t.Fatalf("%d sleeps at %v each", n, cost)
	}
}
