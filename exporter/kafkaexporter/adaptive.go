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
//     a fixed linger of 0 the client sent 2.2–3.8× the requests of the
//     adaptive mode for 0.72–1.15× the answers in the last two whole runs; 8 HTTP clients of 100 records: 3× the requests of the
//     adaptive mode at the same records/s).
//
// A second request while arrivals stop: holding a batch behind the
// request in flight pays only while records keep arriving to join it. A
// few clients that each wait for their answer (an SDK's exporter sends one
// request per signal at a time) are all waiting soon after the request
// leaves; what they handed over would go out unchanged when its answer
// comes, one round trip late. So once nothing has been handed over for
// a quarter of a produce round trip (adaptiveQuietShare) while a broker
// has one request of ours in flight and none has two, the waiting records
// go in a second one, unless the brokers queue (pacing's gap above 0). Records arriving more often than that, as under load or
// from many clients, keep waiting for the answer, so a busy agent batches
// by round trip as before. Measured on one local broker (2026-11-29,
// alternating with the build before, 30 s each): 4 OTLP/gRPC clients of
// 100 spans, three partitions: 418–458k spans/s against 301–350k, CPU per
// span 1.29–1.38 µs against 1.42–1.59, produce requests within 5 %; 4
// clients of 100 text logs (100 KB requests): unchanged; ferry-bench's
// default HTTP shape (8 clients of 100 records) 0.83–1.32× over six rounds
// (median 0.98×, this machine's spread), its produce requests equal; full
// loads (32 clients of 1,000 × 32 B or 524 × 1 KB, the local protocol,
// pan's 128 one-record clients, an idle request) 0.91–1.08×; a fleet of
// 16 agents on 3 brokers (ferry-bench fleet) 675–936 produce requests/s,
// median 703, against 677–720. A budget of 2 at all times gave the same
// spans/s but cost the default HTTP shape 8–10 % in every round (its
// extra requests take the broker's share of this machine's two cores) and
// 25 % more produce requests at full load. The flusher looks for quiet at
// most adaptiveQuietChecks times per request written, so a steady stream
// of records does not keep waking it. While the brokers queue, pacing's
// gap turns it off; without idempotence (acks below all) the Kafka client
// writes one request at a time to a broker, so it is off too (noMore).
//
// Neither Consume nor the Kafka client's hooks wait: they set a flag and
// wake the flusher with a non-blocking send. The flusher flushes once, then
// waits until the request it started is written (or flushWriteWait), so
// that the submits arriving meanwhile join the next request instead of
// racing the first in one each.
//
// Pacing: batching that also follows the brokers' queueing, so that a fleet
// is paced by its cluster. One agent cannot tell a lone host whose
// application sends 300 requests a second from one of many hosts sending 60
// each; only the brokers' load tells them apart, and their answers carry
// it: a queueing broker answers later than the least round trip seen
// lately. The Kafka client's end-to-end hook gives every produce round trip
// to answered (never blocking: a lock, and a sort of 16 values every 8th
// sample). Each broker is judged on its own: a far broker is not a queueing
// one. A request written while another of ours was in flight to the same
// broker is not sampled (it waited for ours there), nor is a failed one,
// nor one over 16 KiB on the wire (its round trip is its own processing).
// Every 8 samples of a broker (from its 16th on) the median of its last 16
// is compared with its least single round trip of the last one to two
// baseWindows (a queueing broker still answers some requests at once; two
// windows without a sample forget it). Beyond max(2 × least, least + 2 ms)
// the broker queues, and the gap between a batch's first record and its
// early send rises by a quarter of the cap; otherwise it falls by an
// eighth, to 0 under 1 ms (30 evaluations from the 50 ms default cap), and
// by an eighth per second (or per 8 caps, if longer) without an evaluation
// (pacingQuietFall), so that
// a host gone quiet after its brokers queued answers at once again. Quick to rise
// and slow to fall from the cap, so that a fleet holding its brokers at the
// edge of queueing stays paced through the moments a median dips (a gap
// proportional to the queueing, as TCP Vegas would have it, oscillated
// there and sent 1.2–1.4× the requests of the fixed linger; falling by a
// third, a fleet its own pacing relieved drifted back to early sends: 16
// agents sent 689–980 requests/s over six runs against 662–732 falling by
// an eighth, alternating on one cluster, 652–658 at a fixed 50 ms). A gap
// at the cap leaves every batch to the client's linger, as in the fixed
// mode; 16 KiB handed over since the last produce request (pacingMinBytes)
// are sent early whatever the gap (a closed loop of clients with large
// requests keeps its round trips: the many small requests of quiet hosts
// are what cost a cluster).
//
// The default cap is 50 ms (2 ms until 2026-11-29, which pacing could not
// move by more than 2 ms: a fleet on it cost its brokers like a short fixed
// linger). Idle, a host answers after one round trip whatever the cap;
// once its brokers queue, it batches as the fixed mode would. Measured with
// ferry-bench fleet (docs/scaling.md): 16 agents, 10,000 records/s in
// requests of 10, 3 brokers: the adaptive mode with a 50 ms cap sent
// 658–732 produce requests a second over seven runs against 652–659 at a
// fixed 50 ms (1,929 with a 2 ms cap) on 2026-11-28, but 796–1,135 over
// five runs against 654–662 on 2026-11-29 (2,391 with a 2 ms cap), whose
// brokers queued less by the test above: a sharper test of queueing is
// issue 37's open part; on an unloaded 3-broker cluster a
// lone client was not paced (one request at a time: 925 against 925
// records/s; 100 requests a second: p50 1–2 ms). The fleet figures in
// this comment, fixed and adaptive alike, were measured with a
// partitioner defect (fixed on 2026-11-29, partitioner.go) that spread
// every linger window's records over three to five partitions: a fixed 50 ms now sends 250 requests a second for
// that fleet, one 40-record batch each, and the adaptive mode 719–983
// (two runs alternating on one cluster), one per application request,
// since these brokers do not queue by the test above; an adaptive fleet
// costs its brokers 2.9–3.9× the fixed linger's requests (make fleet:
// 777 against 250, 3.1×) for answers within a round trip. Fleets of thousands of hosts still raise
// the cap or choose the fixed mode (docs/scaling.md).
//
// Delivery mode spool always uses the fixed delivery.spool.linger: nobody
// waits for Kafka there.

import (
	"context"
	"slices"
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

// adaptiveQuietShare: the quiet that sends what waits in one more request
// is this fraction of the produce round trip lately (a moving average of
// all of them, large ones too): waiting for an answer due in about a
// round trip gathers nothing when nothing came for a quarter of one. Under
// load round trips lengthen with the requests (tens of milliseconds for a
// megabyte), so a steady stream of large client requests, each some
// hundreds of microseconds apart, keeps batching by round trip. With 4
// OTLP clients on this machine (round trips of 0.4 ms) a fixed quiet of
// 100 µs gained 28 %, 250 µs nothing; a fixed 100 µs also sent some full
// loads of large requests early (9 % more produce requests in one round).
const adaptiveQuietShare = 4

// adaptiveQuietMin: no quiet is shorter than this, whatever the round
// trip: a gap that short says nothing about the clients.
const adaptiveQuietMin = 25 * time.Microsecond

// adaptiveQuietChecks bounds the flusher's looks for quiet per request
// written (to any broker).
const adaptiveQuietChecks = 4

// flushWriteWait bounds how long the flusher waits for the request its
// flush started to be written before it flushes again; a flush that found
// nothing to send (the cap sent it already) costs a later submit at most
// this much.
const flushWriteWait = 500 * time.Microsecond

// Pacing constants (see the package text above).
const (
	// pacingBand: round trips up to twice the base, or the base and this
	// much, are not queueing: an idle cluster with acks=all answers in one
	// or two replica fetches, so its round trip varies by itself.
	pacingBand = 2 * time.Millisecond
	// pacingMinBytes: a request carrying this much is sent early whatever
	// the gap (a closed loop of clients with large requests keeps its
	// round trips; the small requests of many quiet hosts are what pacing
	// spaces out).
	pacingMinBytes = 16 << 10
	// pacingSampleMaxBytes: larger produce requests (bytes on the wire)
	// are not sampled. Their round trip is mostly their own time at the
	// broker (appending and replicating them), not queueing: one agent
	// alone at full load sends requests of a megabyte that take tens of
	// milliseconds, and sampled, they paced the small requests of the
	// seconds after a burst (measured: 128 one-record clients at half
	// their rate for about a second with a 50 ms cap). Most requests
	// this large were not paced anyway: pacingMinBytes sends 16 KiB of
	// records at once (counted before compression, since the last
	// request to any broker). A gap raised before a run of such requests
	// falls only by pacingQuietFall until small ones come back.
	pacingSampleMaxBytes = pacingMinBytes
	// pacingFall: out of queueing, the gap loses 1/pacingFall of itself
	// per evaluation (see nextGap).
	pacingFall = 8
	// pacingQuietFall: without an evaluation for this long, the gap also
	// loses 1/pacingFall of itself per period, as if the brokers had been
	// seen not queueing. An evaluation takes rttRing/2 sampled answers: a
	// loaded agent makes several a second, but a host gone quiet after
	// its brokers queued (a burst, a broker restarting) would otherwise
	// keep the gap for its next 240 requests, each waiting up to the cap
	// (a minute of answers up to 50 ms late for a host sending 4
	// requests a second); from the cap to none in about 30 quiet seconds.
	pacingQuietFall = time.Second
	// rttRing: the median is taken over this many round trips.
	rttRing = 16
	// baseWindow: how long a least round trip stays the base; the base
	// follows a cluster that got slower for good after one to two windows.
	baseWindow = 10 * time.Second
)

type adaptive struct {
	budget int32
	// cap is the linger: the longest gap pacing leaves.
	cap time.Duration
	// flush stops every partition's linger and starts the sends; it does
	// not wait for them.
	flush func()
	// flushed counts the early sends (ferry_exporter_kafka_linger_skipped_total).
	flushed func()

	mu        sync.Mutex
	perBroker map[int32]int32
	// busy is the number of brokers with budget requests in flight. The
	// hot path (submitted) reads it, stores last on every submit (a batch
	// handed over while idle but not flushed yet still counts for quiet),
	// and while busy tries watch.
	busy atomic.Int32
	// busyMore is the number of brokers with budget+1 requests in
	// flight: none of them takes another, quiet or not.
	busyMore atomic.Int32
	// last is when the last batch was handed over (UnixNano); watch asks
	// the next submit to wake the flusher, which looks for quiet.
	last  atomic.Int64
	watch atomic.Bool
	// newReq: a request was written since the flusher last looked, so its
	// looks for quiet start over (adaptiveQuietChecks per request).
	newReq atomic.Bool
	// looked counts the flusher's looks for quiet (tests).
	looked atomic.Int64
	// srtt is a moving average of the produce round trips (ns; 1/8 of
	// each new one), whose quarter is the quiet that sends one more
	// request.
	srtt atomic.Int64
	// noMore: no request beyond the budget: the Kafka client writes one
	// produce request at a time to a broker without idempotence (acks
	// below all), so flushes for a second would send nothing; and tests
	// of the budget alone.
	noMore bool
	// pending: records were handed to the client since the last flush.
	pending atomic.Bool
	kick    chan struct{}
	wrote   chan struct{}
	// writeWait is flushWriteWait (a test lengthens it).
	writeWait time.Duration

	// rtt is each broker's round trips for pacing (under mu).
	rtt map[int32]*brokerRTT
	// gap is the pacing gap in ns (written under mu, read by the
	// flusher); since is when the first batch since the last produce
	// request was handed over (UnixNano, 0: none yet); fresh is the
	// bytes handed over since then.
	gap atomic.Int64
	// evalAt is when the gap was last evaluated (under mu; zero: never),
	// a monotonic reading, so that a wall clock stepped back does not
	// hold a quiet host's gap: Gap falls from there (gapAt).
	evalAt time.Time
	since  atomic.Int64
	fresh  atomic.Int64
	// now is time.Now (a test steps it).
	now func() time.Time
}

// brokerRTT is one broker's round trips: the last rttRing of them, how
// many were taken, the least of the current and the previous baseWindow
// and when the current window began, and for each request of ours in
// flight (oldest first; a broker answers a connection's requests in
// order) whether it was written behind another of ours, whose round trip
// its own would include: those are not sampled, or an agent would read
// its own second request as the broker queueing.
type brokerRTT struct {
	ring             [rttRing]time.Duration
	n                int
	curBase, prvBase time.Duration
	winStart         time.Time
	behind           []bool
}

func newAdaptive(budget int32, linger time.Duration, flush, flushed func()) *adaptive {
	return &adaptive{budget: budget, cap: linger, flush: flush, flushed: flushed, perBroker: make(map[int32]int32),
		kick: make(chan struct{}, 1), wrote: make(chan struct{}, 1), writeWait: flushWriteWait,
		rtt: make(map[int32]*brokerRTT), now: time.Now}
}

// sample takes one produce round trip of broker b into the pacing gap;
// under mu, never blocking (a sort of rttRing values every rttRing/2
// samples).
func (a *adaptive) sample(b *brokerRTT, rtt time.Duration) {
	if rtt <= 0 {
		return
	}
	now := a.now()
	// The base is the least single round trip: even a queueing broker
	// answers some requests at once, so it stays an idle broker's figure
	// under a load that never lets up (a least median would rise with it).
	// After two idle windows the old least is forgotten: the broker may
	// have moved meanwhile.
	switch d := now.Sub(b.winStart); {
	case b.winStart.IsZero() || d >= 2*baseWindow:
		b.prvBase, b.curBase, b.winStart = 0, rtt, now
	case d >= baseWindow:
		b.prvBase, b.curBase, b.winStart = b.curBase, rtt, now
	case rtt < b.curBase:
		b.curBase = rtt
	}
	b.ring[b.n%rttRing] = rtt
	b.n++
	if b.n < rttRing || b.n%(rttRing/2) != 0 {
		return
	}
	base := b.curBase
	if b.prvBase > 0 && b.prvBase < base {
		base = b.prvBase
	}
	r := b.ring
	slices.Sort(r[:])
	a.gap.Store(int64(nextGap(a.gapAt(now), r[rttRing/2], base, a.cap)))
	a.evalAt = now
}

// nextGap moves the spacing of early sends after a median produce round
// trip med, against the least round trip seen lately (base): up by a
// quarter of the cap while the brokers queue (the median beyond the dead
// band), down by an eighth of itself while they do not. Quick to rise and
// slow to fall from the cap, so that a fleet which keeps its brokers at
// the edge of queueing stays paced through the moments a median dips.
func nextGap(gap, med, base, limit time.Duration) time.Duration {
	if med > max(2*base, base+pacingBand) {
		return min(gap+limit/4, limit)
	}
	if gap -= gap / pacingFall; gap < time.Millisecond {
		return 0
	}
	return gap
}

// Gap is the current spacing of early sends
// (ferry_exporter_kafka_linger_pacing_seconds).
func (a *adaptive) Gap() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gapAt(a.now())
}

// gapAt is the gap at now (under mu): the last evaluation's, less an
// eighth of itself per quiet period since (a host gone quiet is not kept
// paced). The period is pacingQuietFall, or 8 caps for a long cap: a
// fleet held at a cap of a second evaluates less than once a second, and
// must not fall out of its pacing between evaluations.
func (a *adaptive) gapAt(now time.Time) time.Duration {
	gap := time.Duration(a.gap.Load())
	if gap == 0 || a.evalAt.IsZero() {
		return gap
	}
	quiet := max(pacingQuietFall, 8*a.cap)
	for n := now.Sub(a.evalAt) / quiet; n > 0 && gap > 0; n-- {
		gap = nextGap(gap, 0, 0, a.cap) // a quiet period falls as an evaluation without queueing
	}
	return gap
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
func (a *adaptive) submitted(bytes int64) {
	now := a.now().UnixNano()
	if a.since.Load() == 0 {
		a.since.CompareAndSwap(0, now)
	}
	a.last.Store(now)
	a.fresh.Add(bytes)
	a.pending.Store(true)
	if a.busy.Load() == 0 || a.watch.CompareAndSwap(true, false) {
		signal(a.kick)
	}
}

// written: a produce request was written to broker node (its write hook;
// every write, failed or not, is followed by one answered).
func (a *adaptive) written(node int32) {
	// Records buffered before this write may have left with it: the
	// pacing gap of what is still buffered counts from the next submit
	// (the client's linger still sends it by the cap).
	a.since.Store(0)
	a.fresh.Store(0)
	a.mu.Lock()
	n := a.perBroker[node] + 1
	a.perBroker[node] = n
	b := a.rtt[node]
	if b == nil {
		b = &brokerRTT{}
		a.rtt[node] = b
	}
	if len(b.behind) >= 64 { // answers lost to a reconnect: start over
		b.behind = b.behind[:0]
	}
	b.behind = append(b.behind, n > 1)
	if n == a.budget {
		a.busy.Add(1)
	}
	if n == a.budget+1 {
		a.busyMore.Add(1)
	}
	a.mu.Unlock()
	a.newReq.Store(true)
	signal(a.wrote)
}

// answered: the broker answered a produce request of wire bytes after rtt
// (ok), or it failed (its end-to-end hook). A request of at most
// pacingSampleMaxBytes written while none of ours was in flight to that
// broker feeds the pacing. An answer that leaves its broker below the
// budget, or at it (one request fewer beyond it), wakes the flusher if
// records wait: they go now if no broker is at its budget, else perhaps
// in one more request once quiet.
func (a *adaptive) answered(node int32, rtt time.Duration, wire int, ok bool) {
	a.mu.Lock()
	n := a.perBroker[node]
	if n == 0 { // not one we saw written: nothing to give back
		a.mu.Unlock()
		return
	}
	if ok && rtt > 0 {
		s := a.srtt.Load()
		if s == 0 {
			s = int64(rtt)
		}
		a.srtt.Store(s + (int64(rtt)-s)/8)
	}
	if b := a.rtt[node]; b != nil && len(b.behind) > 0 {
		behind := b.behind[0]
		b.behind = append(b.behind[:0], b.behind[1:]...)
		if ok && !behind && wire <= pacingSampleMaxBytes {
			a.sample(b, rtt)
		}
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
	freed := n == a.budget || n == a.budget-1
	if n == a.budget {
		a.busyMore.Add(-1)
	}
	a.mu.Unlock()
	if freed && a.pending.Load() {
		signal(a.kick)
	}
}

// run is the flusher: one flush at a time, never from a caller's
// goroutine. It returns when stop is closed.
func (a *adaptive) run(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	// hold ends a paced wait: the decision below is taken again when it
	// fires, as after any wake-up (a write and its answer may have come
	// meanwhile, and the gap moved).
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	// looks counts the looks for quiet since the last request written.
	looks := 0
	for {
		select {
		case <-stop:
			return
		case <-a.kick:
		case <-hold.C:
		}
		if a.busy.Load() != 0 {
			// Busy: the broker's answer wakes us again (pending stays),
			// unless arrivals stop first (a second request).
			if a.newReq.Swap(false) {
				looks = 0
			}
			// Gap, not the stored gap: a gap that has fallen away while
			// no evaluation came (pacingQuietFall) does not hold this.
			if a.noMore || a.busyMore.Load() != 0 || looks >= adaptiveQuietChecks || a.Gap() != 0 {
				continue
			}
			if !a.pending.Load() {
				a.watchSubmits()
				continue
			}
			quiet := max(time.Duration(a.srtt.Load())/adaptiveQuietShare, adaptiveQuietMin)
			a.looked.Add(1)
			if wait := time.Unix(0, a.last.Load()).Add(quiet).Sub(a.now()); wait > 0 {
				looks++
				hold.Reset(wait)
				continue
			}
			// Quiet: what waits goes now, in one more request.
		} else if !a.pending.Load() {
			continue
		}
		// Pacing: the brokers are queueing, so this send waits until gap
		// after the first record that waits; the records arriving
		// meanwhile join it. 16 KiB of them (pacingMinBytes) are worth a
		// request to a broker whatever the queueing and go now.
		if gap := a.Gap(); gap > 0 && a.fresh.Load() < pacingMinBytes {
			if gap >= a.cap {
				// Paced to the cap: the client's own linger sends each
				// partition's batch at the cap from its first record, as
				// in the fixed mode; a flush now would also cut short the
				// batches that have only just begun. The next submit
				// decides again.
				a.pending.Store(false)
				continue
			}
			since := a.since.Load()
			if since == 0 { // submitted before the last write, which may have left them behind
				since = a.now().UnixNano()
				a.since.CompareAndSwap(0, since)
			}
			if wait := time.Unix(0, since).Add(gap).Sub(a.now()); wait > 0 {
				hold.Reset(wait)
				continue
			}
		}
		hold.Stop()
		a.since.Store(0)
		if !a.pending.Swap(false) {
			continue
		}
		a.watch.Store(false)
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
		if !a.noMore {
			// The request just written may keep a broker busy: the
			// submits meanwhile are looked at for quiet.
			a.watchSubmits()
		}
	}
}

// watchSubmits makes the next submit wake the flusher even while a broker
// is busy, to look for quiet; one that came already wakes it now.
func (a *adaptive) watchSubmits() {
	a.watch.Store(true)
	if a.pending.Load() && a.watch.CompareAndSwap(true, false) {
		signal(a.kick)
	}
}

// flushCostShare: a flush that took d is followed by no other for
// flushCostShare × d.
const flushCostShare = 10
