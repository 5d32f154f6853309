package proc

import (
	"os"
	"os/exec"
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
