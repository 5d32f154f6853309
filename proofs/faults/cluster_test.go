package faults

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// stallWatch samples a ledger's acknowledged count and remembers the
// longest time in which it did not grow: how long clients went without an
// acknowledgement, the recovery time a fault costs them.
type stallWatch struct {
	longest atomic.Int64 // ns
	stop    chan struct{}
}

func watchStalls(l func() int64) *stallWatch {
	w := &stallWatch{stop: make(chan struct{})}
	go func() {
		last, since := l(), time.Now()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			if n := l(); n != last {
				last, since = n, time.Now()
			} else if d := int64(time.Since(since)); d > w.longest.Load() {
				w.longest.Store(d)
			}
		}
	}()
	return w
}

// TestClusterFaults: a 3-node cluster (replication factor 3,
// min.insync.replicas 2) under load through ferry with the idempotent
// producer. In each case every acknowledged record must be in Kafka
// exactly once; the longest time clients went without an acknowledgement
// is the recovery time.
//
//  1. the leader of partition 0 is SIGKILLed, and restarted later;
//  2. the leader of partition 0 is paused (SIGSTOP) for 30 s, then resumed;
//  3. the disk of the leader of partition 0 fills up (Kafka takes its only
//     log dir offline and the broker shuts itself down); the operator frees
//     the space and starts it again.
func TestClusterFaults(t *testing.T) {
	// A disk per broker, large enough for every case's data at full length
	// (about 3 MB/s per node for 90 s a case), small enough to fill at once.
	c := kafkatest.StartClusterDisks(t, 3, 1024)
	total := dur(25*time.Second, 90*time.Second)
	faultAt := dur(5*time.Second, 20*time.Second)
	down, paused := dur(8*time.Second, 30*time.Second), dur(10*time.Second, 30*time.Second)
	cases := []struct {
		name, what string
		inject     func(t *testing.T, node *kafkatest.Broker)
		needsDisk  bool
	}{
		{"leader-killed", fmt.Sprintf("leader SIGKILL, restarted %s later", down), func(t *testing.T, node *kafkatest.Broker) {
			node.Kill(t)
			time.Sleep(down)
			node.Restart(t)
		}, false},
		{"leader-paused", fmt.Sprintf("leader SIGSTOP for %s", paused), func(t *testing.T, node *kafkatest.Broker) {
			node.Pause(t)
			time.Sleep(paused)
			node.Resume(t)
		}, false},
		{"leader-disk-full", fmt.Sprintf("leader's disk full, freed and restarted %s later", down), func(t *testing.T, node *kafkatest.Broker) {
			node.Fill(t)
			// Kafka takes a log dir that fails a write offline, and a broker
			// with none left shuts itself down: the fault must really happen.
			until := time.Now().Add(down)
			for node.Running() && time.Now().Before(until) {
				time.Sleep(200 * time.Millisecond)
			}
			if node.Running() {
				t.Errorf("the broker still runs %s after its disk filled", down)
			}
			time.Sleep(time.Until(until))
			node.Unfill(t)
			node.Kill(t) // a no-op when it has shut itself down
			node.Restart(t)
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needsDisk && c.DiskMB == 0 {
				t.Skip(c.NoDisks)
			}
			topic := kafkatest.NewTopic(t, c.Nodes[0].Addr, "fault-cluster-"+tc.name, 3)
			a := startAgent(t, c.Brokers, "receivers.http.ack_timeout=90s", "exporter.kafka.request_timeout=30s")
			ctx, cancel := context.WithTimeout(context.Background(), total)
			defer cancel()
			leader := kafkatest.Leader(t, c.Nodes[0].Addr, topic, 0)
			node := c.Node(leader)
			done := make(chan struct{})
			go func() {
				defer close(done)
				time.Sleep(faultAt)
				tc.inject(t, node)
			}()
			var live atomic.Pointer[ledger]
			w := watchStalls(func() int64 {
				if p := live.Load(); p != nil {
					return p.ackedN.Load()
				}
				return 0
			})
			l := load(ctx, t, func() string { return a.HTTP }, topic, loadSpec{clients: 8, batch: 100, size: 100, perSec: 20000, live: &live})
			<-done
			close(w.stop)
			a.Alive()
			// Read from a node that was not hit: the one hit may still be catching up.
			other := c.Nodes[int(leader)%len(c.Nodes)].Addr
			delivered, lost, dups, took := verify(t, other, topic, l, 3*time.Minute)
			stall := time.Duration(w.longest.Load()).Round(100 * time.Millisecond)
			clusterReport.Add(t, outcome{Test: "6. 3-broker cluster: " + tc.what, Mode: "kafka, RF 3, min ISR 2",
				Duration: fmt.Sprintf("%s, fault at %s (node %d led partition 0)", total, faultAt, leader),
				Offered:  l.offered.Load(), Acked: l.ackedN.Load(), Delivered: delivered, Lost: lost, Duplicates: dups,
				Refused: l.refused(), PeakRSSMiB: mib(a.peakRSS.Load()),
				Recovery: fmt.Sprintf("longest gap between acknowledgements %s; all in Kafka %.1fs after load", stall, took.Seconds()),
				Note:     l.statuses()})
			a.Stop()
			if lost > 0 {
				t.Fatalf("%d acknowledged records are not in Kafka", lost)
			}
			if dups > 0 {
				t.Fatalf("%d records twice in Kafka with the idempotent producer", dups)
			}
			if l.ackedN.Load() == 0 {
				t.Fatal("nothing was acknowledged")
			}
		})
	}
}
