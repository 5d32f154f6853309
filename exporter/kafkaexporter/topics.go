package kafkaexporter

import (
	"sync"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// topics bounds what client-chosen topic names can cost. The Kafka client
// keeps every topic it was asked to produce to in its metadata (and a
// goroutine per topic whose metadata it is still waiting for), forever: a
// client that names 20,000 made-up topics makes every metadata request
// carry them. So:
//   - a topic the exporter has not yet seen acknowledged is pending while
//     it has records in flight; at most maxPending topics may be pending at
//     once, and a batch for one more is refused (retryable) before anything
//     of it reaches the client;
//   - a topic whose records failed as unknown is purged from the Kafka
//     client once none of its records is in flight (by a goroutine of its
//     own, never in a promise);
//   - topics seen acknowledged are known and cost one map lookup per batch.
type topics struct {
	known      sync.Map // topic → struct{}
	mu         sync.Mutex
	pending    map[string]*pendingTopic
	maxPending int
	purge      chan string
}

type pendingTopic struct {
	inflight int64
	unknown  bool // some record failed with unknown topic
}

func newTopics(maxPending int) *topics {
	return &topics{pending: map[string]*pendingTopic{}, maxPending: maxPending, purge: make(chan string, 1024)}
}

// errTooManyTopics refuses a batch naming one topic too many that Kafka has
// not confirmed yet.
var errTooManyTopics = &consumer.RetryableError{Reason: "too_many_pending_topics", Busy: true, After: 5 * time.Second,
	Msg: "ferry is looking up too many topics Kafka has not confirmed yet (exporter.kafka.max_pending_topics); retry later"}

// admit counts b's records of topics not yet known as pending and marks
// them in mark (allocated only then); it refuses the batch if that would
// make more than maxPending topics pending. The hot path, a batch of one
// known topic, is one lookup.
func (t *topics) admit(b *record.Batch, mark *[]bool) error {
	last := ""
	lastKnown := false
	var need []string
	for i := range b.Records {
		tp := b.Records[i].Topic
		if tp != last || i == 0 {
			last = tp
			_, lastKnown = t.known.Load(tp)
		}
		if !lastKnown && (len(need) == 0 || need[len(need)-1] != tp) {
			need = append(need, tp)
		}
	}
	if len(need) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fresh := 0
	for j, tp := range need {
		if _, ok := t.pending[tp]; !ok && !contains(need[:j], tp) {
			fresh++
		}
	}
	if t.maxPending > 0 && len(t.pending)+fresh > t.maxPending {
		return errTooManyTopics
	}
	if cap(*mark) < len(b.Records) {
		*mark = make([]bool, len(b.Records))
	}
	*mark = (*mark)[:len(b.Records)]
	for i := range b.Records {
		tp := b.Records[i].Topic
		if !contains(need, tp) {
			continue
		}
		p := t.pending[tp]
		if p == nil {
			p = &pendingTopic{}
			t.pending[tp] = p
		}
		p.inflight++
		(*mark)[i] = true
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// settle records the outcome of one pending record. It never blocks: it is
// called from the Kafka client's promise.
func (t *topics) settle(topic string, ok, unknown bool) {
	if ok {
		t.known.Store(topic, struct{}{})
	}
	t.mu.Lock()
	p := t.pending[topic]
	if p == nil {
		t.mu.Unlock()
		return
	}
	p.inflight--
	p.unknown = p.unknown || unknown
	done := p.inflight <= 0
	if done {
		delete(t.pending, topic)
	}
	t.mu.Unlock()
	if done && p.unknown && !ok {
		select {
		case t.purge <- topic:
		default: // the purger is behind; the topic stays in the client's metadata
		}
	}
}

// Pending is the number of topics pending.
func (t *topics) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// purger removes unknown topics from the Kafka client unless records for
// them arrived again meanwhile.
func (e *Exporter) purger() {
	defer e.wg.Done()
	for {
		select {
		case <-e.stop:
			return
		case tp := <-e.tp.purge:
			e.tp.mu.Lock()
			_, again := e.tp.pending[tp]
			e.tp.mu.Unlock()
			if again {
				continue
			}
			e.cl.PurgeTopicsFromProducing(tp)
			e.m.purged.Inc()
		}
	}
}
