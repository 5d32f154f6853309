package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnit: systemd's analyser accepts the unit (with ExecStart
// pointed at a real binary) and rates its sandbox at exposure 2.0 or
// less ("OK"); the settings the install relies on are there.
func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("ferry.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DynamicUser=yes", "StateDirectory=ferry", "ProtectSystem=strict", "ExecReload=/bin/kill -HUP $MAINPID", "NoNewPrivileges=yes"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ferry")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/ferry").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	f := filepath.Join(dir, "ferry.service")
	if err := os.WriteFile(f, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/ferry", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("systemd-analyze", "verify", f).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err := exec.Command("systemd-analyze", "security", "--offline=true", "--threshold=20", f).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security (threshold 2.0): %v\n%s", err, out)
	}
	t.Logf("%s", lastLine(string(out)))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
