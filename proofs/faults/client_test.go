package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// 6. The Go client sends over the local protocol while the agent is killed
// with SIGKILL and restarted on the same socket: every record's callback
// runs exactly once, and every record reported accepted is in Kafka.
func TestClientAgentKilledMidStream(t *testing.T) { clientKill(t, false) }

// 6b. The same in delivery mode spool with delivery.guarantee
// exactly_once: the client's defaults (protocol version 3: a producer id
// and a sequence per frame) let the restarted agent recognise the frames
// it had stored before the kill whose answers the kill cut, and the
// spool's transactions skip what Kafka had committed: a read_committed
// consumer sees every accepted record exactly once.
func TestClientAgentKilledExactlyOnce(t *testing.T) { clientKill(t, true) }

func clientKill(t *testing.T, exactlyOnce bool) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-client", 3)
	dir, err := os.MkdirTemp("", "fk")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "f.sock")
	sets := []string{"receivers.local.socket=" + sock, "receivers.local.listen=" + agenttest.FreeAddr(t)}
	if exactlyOnce {
		sets = append(append(sets, spoolSets(t, "spool", filepath.Join(dir, "spool"))...), "delivery.guarantee=exactly_once")
	}
	a := startAgent(t, brokers, sets...)
	c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}, BatchRecords: 200,
		RetryBackoff: 20 * time.Millisecond, RetryBackoffMax: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	total := dur(6*time.Second, 40*time.Second)
	type fate struct {
		n  atomic.Int32
		ok atomic.Bool
	}
	var calls sync.Map // seq → *fate
	var accepted, failed, offered atomic.Int64
	var restartedIn time.Duration
	var a2 *agent
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(total / 3)
		a.Kill()
		killed := time.Now()
		a2 = startAgent(t, brokers, sets...)
		restartedIn = time.Since(killed)
	}()
	deadline := time.Now().Add(total)
	pad := strings.Repeat("p", 80)
	for seq := 0; time.Now().Before(deadline); seq++ {
		f := new(fate)
		calls.Store(seq, f)
		offered.Add(1)
		c.Produce(context.Background(), &client.Record{Topic: topic, Key: []byte(strconv.Itoa(seq % 97)), Value: []byte(fmt.Sprintf("c:%d:%s", seq, pad))},
			func(_ *client.Record, err error) {
				f.n.Add(1)
				if err != nil {
					failed.Add(1)
				} else {
					f.ok.Store(true)
					accepted.Add(1)
				}
			})
		if seq%200 == 0 {
			time.Sleep(time.Millisecond) // ~100k records/s at most
		}
	}
	<-done
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	twice := 0
	calls.Range(func(_, v any) bool {
		if v.(*fate).n.Load() != 1 {
			twice++
		}
		return true
	})
	if twice > 0 {
		t.Fatalf("%d records were not called back exactly once", twice)
	}
	var values []string
	if exactlyOnce {
		for deadline := time.Now().Add(2 * time.Minute); ; {
			values = committedValues(t, brokers, topic)
			if len(values) >= int(accepted.Load()) || time.Now().After(deadline) {
				break
			}
		}
	} else {
		for _, r := range kafkatest.Consume(t, brokers, topic, int(accepted.Load()), 2*time.Minute) {
			values = append(values, string(r.Value))
		}
	}
	seen := map[int]int{}
	for _, v := range values {
		parts := strings.SplitN(v, ":", 3)
		seq, _ := strconv.Atoi(parts[1])
		seen[seq]++
	}
	var lost, dups int64
	calls.Range(func(k, v any) bool {
		switch n := seen[k.(int)]; {
		case n == 0 && v.(*fate).ok.Load():
			lost++ // reported accepted, not in Kafka
		case n > 1:
			dups += int64(n - 1)
		}
		return true
	})
	name, mode := "6. Go client, agent SIGKILL mid-stream", "kafka, local protocol (Unix socket)"
	if exactlyOnce {
		name, mode = "6b. Go client, agent SIGKILL mid-stream, exactly once", "spool + exactly_once, local protocol v3 (Unix socket), read_committed"
	}
	record(t, outcome{Test: name, Mode: mode,
		Duration: fmt.Sprintf("%s, kill at %s", total, total/3), Offered: offered.Load(), Acked: accepted.Load(),
		Delivered: int64(len(seen)), Lost: lost, Duplicates: dups, PeakRSSMiB: mib(a.peakRSS.Load()),
		Recovery: fmt.Sprintf("serving %.1fs after the kill; the client reconnected and sent the unanswered again", restartedIn.Seconds()),
		Note:     fmt.Sprintf("every callback exactly once; %d failed", failed.Load())})
	a2.Stop()
	if failed.Load() > 0 {
		t.Fatalf("%d records failed: the client must retry through a restart", failed.Load())
	}
	if lost > 0 {
		t.Fatalf("%d records reported accepted are not in Kafka", lost)
	}
	if exactlyOnce && dups > 0 {
		t.Fatalf("%d duplicates with exactly_once and the client's sequences", dups)
	}
}
