package operate

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestOperatorViewFiles: with a files receiver, /status and ferry top show
// its include pattern's lines, bytes and lag, as they grow: the file lag the
// issue asks the live view for, read from the real binary tailing a real
// file into a real Kafka.
func TestOperatorViewFiles(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "operate-files", 1)
	dir := t.TempDir()
	log := filepath.Join(dir, "app.log")
	const lines = 500
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, "line %04d of the application's log\n", i)
	}
	if err := os.WriteFile(log, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	glob := filepath.Join(dir, "*.log")
	a := agenttest.Start(t, ferryBin, fmt.Sprintf("exporter: {kafka: {brokers: [%q]}}\n", brokers),
		"receivers.files.enabled=true", "receivers.files.include=["+glob+"]", "receivers.files.topic="+topic,
		"receivers.files.checkpoint_dir="+filepath.Join(dir, "ck"), "receivers.files.start_at=beginning",
		"receivers.files.poll_interval=100ms")

	deadline := time.Now().Add(30 * time.Second)
	for {
		r := report(t, a.Admin)
		if f := r.Files; f != nil && len(f.Groups) == 1 && f.Groups[0].Lines.Total == lines && f.Groups[0].LagBytes == 0 {
			g := f.Groups[0]
			// bytes: keys (the file's path by default) and values (the
			// lines without their newline)
			if g.Group != glob || g.Watched != 1 || g.Bytes.Total < float64(b.Len()-lines) {
				t.Fatalf("files row %+v, want %s, 1 file, at least %d bytes", g, glob, b.Len()-lines)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the files section never showed %d lines read with no lag: %+v", lines, r.Files)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, err := exec.Command(ferryBin, "top", "--once", "--width", "140", "--admin", a.Admin).CombinedOutput()
	if err != nil {
		t.Fatalf("ferry top --once: %v\n%s", err, out)
	}
	frame := string(out)
	if !strings.Contains(frame, "FILES") || !strings.Contains(frame, glob) || !strings.Contains(frame, fmt.Sprint(lines)) {
		t.Fatalf("ferry top shows no files row for %s with %d lines:\n%s", glob, lines, frame)
	}
}
