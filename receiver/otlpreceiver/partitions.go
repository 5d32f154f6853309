package otlpreceiver

import (
	"context"
	"sync"
	"time"

	"github.com/ferryhq/ferry/receiver"
)

// partitionCounts keeps the partition counts of the topics that traces go
// to with partition trace_partition, so that the encoder can group a
// request's spans by the partition their trace id maps to (one record per
// partition instead of one per trace: the split's cost, issue 37).
//
// The request path never waits for the cluster. A topic not known yet is
// answered 0, and the encoder then writes a record per trace keyed by its
// id, which the exporter's partitioner (murmur2, the default, or
// uniform_bytes; round_robin ignores keys) puts on the very partition the
// grouping would have chosen: the first requests to a topic, or every
// request while the cluster cannot be asked, keep traces together at
// trace_id's cost. One goroutine asks the cluster (through the exporter's
// connections, receiver.Env.Topics) for every topic missing or older than
// partitionsMaxAge, in one request; a count is reused meanwhile. A topic
// whose partitions were added is grouped by its old count until then, as
// a Kafka client keyed by trace id partitions by its own metadata's.
type partitionCounts struct {
	ask receiver.Topics

	mu      sync.Mutex
	known   map[string]knownCount
	pending map[string]struct{} // to ask, or being asked
	wake    chan struct{}
	// refused is, for a topic pending when Kafka refused one of its
	// partitions, the least such partition: its answer must not offer it.
	// At most one entry per pending topic.
	refused map[string]int32
	// ctx ends the asking goroutine (and an ask in progress) at close.
	ctx     context.Context
	stop    context.CancelFunc
	done    chan struct{}
	started bool
}

type knownCount struct {
	n  int32
	at time.Time
	// failed: the cluster could not be asked (n is the last count it
	// gave, if any); asked again after partitionsRetry.
	failed bool
}

const (
	// partitionsMaxAge: how long a count is reused, as the Kafka front's
	// metadata_max_age (one Metadata request per topic per period).
	partitionsMaxAge = 30 * time.Second
	partitionsRetry  = 5 * time.Second
	// partitionsMaxTopics bounds the cache: a topic may come from a
	// template (tenant, header), so names are not a fixed set. Past it the
	// cache starts over (the requests meanwhile are written per trace).
	partitionsMaxTopics = 10000
	partitionsAskWait   = 10 * time.Second
)

func newPartitionCounts(ask receiver.Topics) *partitionCounts {
	ctx, stop := context.WithCancel(context.Background())
	return &partitionCounts{ask: ask, known: map[string]knownCount{}, pending: map[string]struct{}{}, refused: map[string]int32{},
		wake: make(chan struct{}, 1), ctx: ctx, stop: stop, done: make(chan struct{})}
}

// get returns topic's partition count, 0 if not known yet; a count missing
// or out of date is asked for in the background.
func (p *partitionCounts) get(topic string) int {
	now := time.Now()
	p.mu.Lock()
	k, ok := p.known[topic]
	age := partitionsMaxAge
	if k.failed {
		age = partitionsRetry
	}
	if !ok || now.Sub(k.at) >= age {
		if _, asked := p.pending[topic]; !asked && len(p.pending) < partitionsMaxTopics {
			p.pending[topic] = struct{}{}
			select {
			case p.wake <- struct{}{}:
			default:
			}
		}
	}
	p.mu.Unlock()
	return int(k.n)
}

// forget drops topic's count when it still offers partition, which Kafka
// refused because the topic no longer has it (the exporter's notice,
// receiver.Env.WatchShrink); a count already below it stays (a late
// refusal of records placed before). Until the cluster has been asked
// again (the next get asks), the topic's requests are written per trace,
// which is right under any count; before, they were grouped by the old
// count, and refused, for up to partitionsMaxAge. An ask under way may
// answer the old count: an answer still offering the refused partition is
// not kept, and the topic is asked again after partitionsRetry (not at
// once: the producer's own metadata may take a moment to follow). Called
// from the Kafka client's promise goroutine: a short lock, no wait.
func (p *partitionCounts) forget(topic string, partition int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k, ok := p.known[topic]; ok && k.n > partition {
		delete(p.known, topic)
	}
	if _, asking := p.pending[topic]; asking {
		if r, ok := p.refused[topic]; !ok || partition < r {
			p.refused[topic] = partition
		}
	}
}

// start runs the asking goroutine until close.
func (p *partitionCounts) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started {
		return
	}
	p.started = true
	go p.run()
}

// close stops the goroutine and waits for it (an ask in progress is
// cancelled).
func (p *partitionCounts) close() {
	p.mu.Lock()
	started := p.started
	p.started = false
	p.mu.Unlock()
	if !started {
		return
	}
	p.stop()
	<-p.done
}

func (p *partitionCounts) run() {
	defer close(p.done)
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		names := make([]string, 0, len(p.pending))
		for n := range p.pending {
			names = append(names, n)
		}
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(p.ctx, partitionsAskWait)
		infos, err := p.ask(ctx, names)
		cancel()
		p.store(names, infos, err, time.Now())
	}
}

// store records the cluster's answer for names. A count that still offers
// a partition Kafka refused meanwhile is not kept (see forget).
func (p *partitionCounts) store(names []string, infos []receiver.TopicInfo, err error, now time.Time) {
	got := make(map[string]receiver.TopicInfo, len(infos))
	for _, t := range infos {
		got[t.Topic] = t
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	added := func() int {
		a := 0
		for _, n := range names {
			if _, ok := p.known[n]; !ok {
				a++
			}
		}
		return a
	}
	if len(p.known)+added() > partitionsMaxTopics {
		// Failed and out-of-date entries go first; only if that is not
		// enough does the cache start over.
		for n, k := range p.known {
			if k.failed || now.Sub(k.at) >= partitionsMaxAge {
				delete(p.known, n)
			}
		}
		if len(p.known)+added() > partitionsMaxTopics {
			clear(p.known)
		}
	}
	for _, n := range names {
		delete(p.pending, n)
		refused, stale := p.refused[n]
		delete(p.refused, n)
		t, ok := got[n]
		switch {
		case err == nil && ok && stale && t.Partitions > refused:
			// From before the refusal: per trace until asked again.
			p.known[n] = knownCount{at: now, failed: true}
		case err != nil:
			k := p.known[n]
			k.at, k.failed = now, true
			p.known[n] = k
		case !ok || t.Err != nil || t.Partitions <= 0:
			// Not a topic (yet): records per trace, and the exporter
			// creates it or refuses them; asked again after a retry.
			p.known[n] = knownCount{at: now, failed: true}
		default:
			p.known[n] = knownCount{n: t.Partitions, at: now}
		}
	}
}
