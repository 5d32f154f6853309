package telemetry

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimitedLogsOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	l := NewLimited(slog.New(slog.NewTextHandler(&buf, nil)), 50*time.Millisecond)
	for i := 0; i < 100; i++ {
		l.Log(slog.LevelWarn, "k", "kafka down")
	}
	if n := strings.Count(buf.String(), "kafka down"); n != 1 {
		t.Fatalf("%d lines for 100 calls in one interval", n)
	}
	time.Sleep(60 * time.Millisecond)
	l.Log(slog.LevelWarn, "k", "kafka down")
	if !strings.Contains(buf.String(), "suppressed=99") {
		t.Fatalf("the next line must say how many were suppressed:\n%s", buf.String())
	}
	l.Log(slog.LevelWarn, "other", "different key")
	if !strings.Contains(buf.String(), "different key") {
		t.Fatal("keys are limited independently")
	}
}

func TestLabelsCapCardinality(t *testing.T) {
	l := NewLabels(3)
	for i := 0; i < 10; i++ {
		l.Get(fmt.Sprint("t", i))
	}
	if l.Get("t0") != "t0" || l.Get("t2") != "t2" || l.Get("t9") != "_other" || l.Get("new") != "_other" {
		t.Fatal("cap not applied")
	}
}

// TestTopicLabelsShared: every component folds the same topic names into
// "_other", whichever saw them first, so per-topic counts of different
// stages can be compared.
func TestTopicLabelsShared(t *testing.T) {
	set := TestSettings()
	receiver, exporter := set.Topics, set.Topics
	for i := 0; i < maxLabelValues; i++ {
		receiver.Get(fmt.Sprintf("t%d", i))
	}
	if got := exporter.Get("late"); got != "_other" {
		t.Fatalf("a topic past the cap is %q for another component", got)
	}
	if got := exporter.Get("t7"); got != "t7" {
		t.Fatalf("a topic one component labelled is %q for another", got)
	}
}
