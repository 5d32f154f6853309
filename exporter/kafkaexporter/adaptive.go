package kafkaexporter

// Adaptive linger (exporter.kafka.linger_mode: adaptive, the default).
//
// A fixed linger makes every batch wait for it, even when nothing else is
// coming: a client that waits for Kafka's ack (delivery mode kafka, spill's
// memory path, the local protocol, the Kafka front) with a few requests in
// flight is bound by linger + one produce round trip per request. The
// adaptive mode sends at once while Kafka is idle and lets batches grow only
// while Kafka is busy:
//
//   - The Kafka client keeps exporter.kafka.linger as its linger: the cap, the
//     longest a record waits for others, as in the fixed mode.
//   - Every produce request written to a broker is counted until that broker
//     answers it (the client's write and end-to-end hooks, once per request).
//   - When a batch has been handed to the client and no broker has
//     adaptiveBudget produce requests in flight, the exporter's flusher
//     goroutine stops every partition's linger (kgo.Client.Flush with a done
//     context: it starts the sends and returns without waiting), so the batch
//     leaves now and its client is answered after one round trip.
//   - While a broker has its budget in flight, batches wait, gathering the
//     records that arrive meanwhile; when its answer comes back they are sent
//     at once, or at the cap, whichever is first. Under load this is batching
//     by round trip ("natural batching"), which Kafka favours: a broker reads
//     one request per connection at a time, so more requests in flight only
//     queue there while costing an append each (BENCHMARKS.md section 4: at
//     a fixed linger of 0 the client sent 6× the requests for fewer
//     answers; 8 HTTP clients of 100 records: 3× the requests of the
//     adaptive mode at the same records/s).
//
// Neither Consume nor the Kafka client's hooks wait: they set a flag and
// wake the flusher with a non-blocking send. The flusher flushes once, then
// waits until the request it started is written (or flushWriteWait), so
// that the submits arriving meanwhile join the next request instead of
// racing the first in one each.
//
// The price: an agent sends up to one request per round trip per broker,
// not one per linger, when its applications send often; fleets that size
// their brokers by the number of produce requests set linger_mode: fixed with
// a long linger (docs/scaling.md). Delivery mode spool always uses the
// fixed delivery.spool.linger: nobody waits for Kafka there.
//
// Not yet fleet-aware (issue 37). One agent cannot tell a lone host whose
// application sends 300 requests a second from one of many hosts sending 60
// each; only the brokers' load tells them apart. Tried on 2026-11-28 and not
// kept: a 50 ms cap with early sends spaced by 8 × (smoothed produce round
// trip − its windowed minimum), requests of 16 KiB or more exempt (TCP
// Vegas's signal). Against 16 agents on 3 local brokers it cut the p99 (118–199
// ms against 219–614 at a fixed 50 ms) at 1.3–1.4× the requests, but the
// brokers' CPU moved more between identical rows (79–161 %, JIT warm-up and
// 2 shared cores) than between the modes; and on an unloaded 3-broker
// cluster (acks all) the round trip varies by itself, so a lone synchronous
// client was paced: 556–622 records/s against 3,356, one idle request 9–10
// ms against 2. A dead band (queueing counted only past 2 × the minimum and
// +5 ms) left the fleet result inside the noise. The signal needs brokers
// that do not share the agents' cores to be judged.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// adaptiveBudget is the produce requests a broker may have in flight
// before batches wait for its answer. One: a second request would mostly
// queue behind the first at the broker (it reads a connection's requests
// one at a time), and what it carries goes in the next request anyway,
// one round trip later, with everything else that arrived. Measured on one
// local broker (8 HTTP clients of 100 records; 64 clients of 10 × 1 KB;
// full load): budgets of 2 and 3 gave the same records/s within the
// run-to-run noise and 15–40% more produce requests.
const adaptiveBudget = 1

// flushWriteWait bounds how long the flusher waits for the request its
// flush started to be written before it flushes again; a flush that found
// nothing to send (the cap sent it already) costs a later submit at most
// this much.
const flushWriteWait = 500 * time.Microsecond

type adaptive struct {
	budget int32
	// flush stops every partition's linger and starts the sends; it does
	// not wait for them.
	flush func()
	// flushed counts the early sends (ferry_exporter_kafka_linger_skipped_total).
	flushed func()

	mu        sync.Mutex
	perBroker map[int32]int32
	// busy is the number of brokers with budget requests in flight; the
	// hot path reads only this.
	busy atomic.Int32
	// pending: records were handed to the client since the last flush.
	pending atomic.Bool
	kick    chan struct{}
	wrote   chan struct{}
	// writeWait is flushWriteWait (a test lengthens it).
	writeWait time.Duration
}

func newAdaptive(budget int32, flush, flushed func()) *adaptive {
	return &adaptive{budget: budget, flush: flush, flushed: flushed, perBroker: make(map[int32]int32),
		kick: make(chan struct{}, 1), wrote: make(chan struct{}, 1), writeWait: flushWriteWait}
}

// clientFlush is cl.Flush with a context already done: franz-go stops every
// partition's linger and wakes each broker's sender before it looks at the
// context, then returns without waiting for Kafka.
func clientFlush(f func(context.Context) error) func() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return func() { _ = f(ctx) }
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// submitted: a batch was handed to the Kafka client (Consume, after its
// last record). Never blocks.
func (a *adaptive) submitted() {
	a.pending.Store(true)
	if a.busy.Load() == 0 {
		signal(a.kick)
	}
}

// written: a produce request was written to broker node (its write hook;
// every write, failed or not, is followed by one answered).
func (a *adaptive) written(node int32) {
	a.mu.Lock()
	n := a.perBroker[node] + 1
	a.perBroker[node] = n
	if n == a.budget {
		a.busy.Add(1)
	}
	a.mu.Unlock()
	signal(a.wrote)
}

// answered: the broker answered a produce request, or it failed (its
// end-to-end hook). Records waiting since are sent now if no broker is at
// its budget.
func (a *adaptive) answered(node int32) {
	a.mu.Lock()
	n := a.perBroker[node]
	if n == 0 { // not one we saw written: nothing to give back
		a.mu.Unlock()
		return
	}
	n--
	if n == 0 {
		delete(a.perBroker, node) // brokers come and go: keep the map to those busy
	} else {
		a.perBroker[node] = n
	}
	if n == a.budget-1 {
		a.busy.Add(-1)
	}
	a.mu.Unlock()
	if a.pending.Load() && a.busy.Load() == 0 {
		signal(a.kick)
	}
}

// run is the flusher: one flush at a time, never from a caller's
// goroutine. It returns when stop is closed.
func (a *adaptive) run(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-a.kick:
		}
		if a.busy.Load() != 0 || !a.pending.Swap(false) {
			// Busy: the broker's answer wakes us again (pending stays).
			continue
		}
		select { // a write from before this flush says nothing about it
		case <-a.wrote:
		default:
		}
		t0 := time.Now()
		a.flush()
		spent := time.Since(t0)
		a.flushed()
		t.Reset(a.writeWait)
		select {
		case <-a.wrote:
			t.Stop() // go 1.23+: no stale tick after Stop
		case <-t.C:
		case <-stop:
			return
		}
		// A flush stops the linger of every partition the client knows:
		// about 0.7 µs for 12 partitions, 16 µs for 1,200, 180 µs for 12,000
		// (BenchmarkEarlyFlush). Early sends take at most a tenth of the
		// flusher's time, so an agent writing to thousands of topics
		// drifts toward the fixed linger rather than spending a core.
		if rest := time.Until(t0.Add(flushCostShare * spent)); rest > 0 {
			t.Reset(rest)
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}
}

// flushCostShare: a flush that took d is followed by no other for
// flushCostShare × d.
const flushCostShare = 10
