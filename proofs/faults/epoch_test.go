package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// javaProducer is testdata/EpochBump.java running: the Java client, driven
// record by record.
type javaProducer struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	mu     sync.Mutex
	answer map[string]string // value → "ACK" or the ERR line
	log    []string
	bumped bool
	done   chan struct{}
}

func startJavaProducer(t *testing.T, bootstrap, topic string) *javaProducer {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	cp, err := exec.Command(filepath.Join(dir, "..", "..", "scripts", "kafka-local"), "classpath").Output()
	if err != nil {
		t.Fatalf("kafka-local classpath: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(cp)), "\n")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	// INFO from the client shows its epoch ("ProducerId set to ... with
	// epoch 1").
	j := &javaProducer{t: t, answer: map[string]string{}, done: make(chan struct{})}
	j.cmd = exec.CommandContext(ctx, "java", "-Xmx256m", "-Dorg.apache.logging.log4j.level=INFO", "-cp", lines[len(lines)-1],
		filepath.Join(dir, "testdata", "EpochBump.java"), bootstrap, topic)
	out, err := j.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	j.cmd.Stderr = j.cmd.Stdout
	if j.in, err = j.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(j.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l := sc.Text()
			j.mu.Lock()
			switch {
			case strings.HasPrefix(l, "ACK "):
				j.answer[strings.TrimPrefix(l, "ACK ")] = "ACK"
			case strings.HasPrefix(l, "ERR "):
				v, _, _ := strings.Cut(strings.TrimPrefix(l, "ERR "), " ")
				j.answer[v] = l
			default:
				j.log = append(j.log, l)
				j.bumped = j.bumped || strings.Contains(l, "with epoch 1")
			}
			j.mu.Unlock()
		}
	}()
	return j
}

func (j *javaProducer) send(v string) {
	if _, err := fmt.Fprintf(j.in, "send %s\n", v); err != nil {
		j.t.Fatal(err)
	}
}

// await waits until every value has its answer.
func (j *javaProducer) await(timeout time.Duration, values ...string) {
	j.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		j.mu.Lock()
		n := 0
		for _, v := range values {
			if j.answer[v] != "" {
				n++
			}
		}
		j.mu.Unlock()
		if n == len(values) {
			return
		}
		if time.Now().After(deadline) {
			j.t.Fatalf("no answer for %v within %s\n%s", values, timeout, j.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (j *javaProducer) logs() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return strings.Join(j.log, "\n")
}

func (j *javaProducer) close() {
	_, _ = io.WriteString(j.in, "close\n")
	<-j.done
	if err := j.cmd.Wait(); err != nil {
		j.t.Fatalf("the Java producer: %v\n%s", err, j.logs())
	}
}

// TestJavaProducerEpochBump: the Java producer (idempotent, the default)
// through ferry's Kafka front, while the broker behind ferry is paused.
// Its first record is written; two more are in flight when the broker
// stops, expire at the client (delivery.timeout.ms 3 s), and the producer
// bumps its epoch and starts its sequences at 0 again. Once the broker is
// back, its next records carry the same sequences (0, 1, 2 ...) as the old
// epoch's batches, with other bytes: ferry must deliver them, not answer
// them as retries of those batches (it answered them OK and dropped them).
// Every record the producer was told was written must be in Kafka.
func TestJavaProducerEpochBump(t *testing.T) {
	kafkatest.SkipShort(t)
	b := kafkatest.Start(t)
	topic := kafkatest.NewTopic(t, b.Addr, "fault-epoch", 1)
	a := startAgent(t, b.Addr, "receivers.kafka.enabled=true")
	j := startJavaProducer(t, a.KafkaFront, topic)
	j.send("java-0")
	j.await(time.Minute, "java-0")

	b.Pause(t)
	paused := time.Now()
	j.send("java-1")
	j.send("java-2")
	j.await(20*time.Second, "java-1", "java-2") // expired
	time.Sleep(time.Second)                     // the bump follows
	b.Resume(t)
	stalled := time.Since(paused)
	var after []string
	for i := 3; i < 9; i++ {
		v := fmt.Sprint("java-", i)
		j.send(v)
		j.await(30*time.Second, v)
		after = append(after, v)
	}
	j.close()
	a.Alive()

	got := map[string]int{}
	for _, r := range kafkatest.ConsumeAll(t, b.Addr, topic, 5*time.Second) {
		got[string(r.Value)]++
	}
	var acked, lost, failed []string
	for v, ans := range j.answer {
		switch {
		case ans != "ACK":
			failed = append(failed, v)
		case got[v] == 0:
			lost = append(lost, v)
			acked = append(acked, v)
		default:
			acked = append(acked, v)
		}
	}
	dups := 0
	for _, c := range got {
		dups += c - 1
	}
	record(t, outcome{Test: "7. Java producer through the Kafka front, broker paused until two batches expire: epoch bumped, sequences from 0 again", Mode: "kafka",
		Duration: fmt.Sprintf("9 records, broker paused %.1fs", stalled.Seconds()), Offered: 9, Acked: int64(len(acked)), Delivered: int64(len(got)),
		Lost: int64(len(lost)), Duplicates: int64(dups), PeakRSSMiB: mib(a.peakRSS.Load()),
		Recovery: fmt.Sprintf("epoch bumped: %v", j.bumped),
		Note:     fmt.Sprintf("%d expired at the client (delivered later by ferry, their outcome unknown to the client)", len(failed))})
	if len(lost) > 0 {
		t.Fatalf("%d records the Java producer was told were written are not in Kafka: %v", len(lost), lost)
	}
	if !j.bumped {
		t.Fatalf("the producer never bumped its epoch: the case was not exercised\n%s", j.logs())
	}
	if len(failed) == 0 {
		t.Fatalf("no record expired at the client: the pause did not expire batches\n%s", j.logs())
	}
}
