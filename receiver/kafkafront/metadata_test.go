package kafkafront

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/receivertest"
)

// TestTopicCache: answers are reused for max age, one cluster request per
// batch of missing topics; a topic the cluster does not have (or could not
// be asked about) is asked again after 2 s, not max age, so a topic created
// meanwhile is found soon; and client-chosen names cannot grow the cache
// without bound.
func TestTopicCache(t *testing.T) {
	asks, fail := 0, false
	cluster := func(_ context.Context, names []string) ([]TopicInfo, error) {
		asks++
		if fail {
			return nil, errors.New("down")
		}
		var out []TopicInfo
		for _, n := range names {
			if n != "missing" {
				out = append(out, TopicInfo{Topic: n, Partitions: 3})
			}
		}
		return out, nil
	}
	c := newTopicCache(cluster, time.Minute)
	got := c.get(context.Background(), []string{"a", "b", "missing"})
	if asks != 1 || got[0].Partitions != 3 || got[1].Partitions != 3 || !errors.Is(got[2].Err, errUnknownTopic) {
		t.Fatalf("first get: %d asks, %+v", asks, got)
	}
	c.get(context.Background(), []string{"a", "b"})
	if asks != 1 {
		t.Fatalf("a fresh answer was not reused: %d asks", asks)
	}
	// The negative answer expires after 2 s.
	c.mu.Lock()
	e := c.topics["missing"]
	e.at = e.at.Add(-3 * time.Second)
	c.topics["missing"] = e
	c.mu.Unlock()
	c.get(context.Background(), []string{"missing"})
	if asks != 2 {
		t.Fatalf("a missing topic was not asked again after 2 s: %d asks", asks)
	}
	fail = true
	if got := c.get(context.Background(), []string{"new"}); !errors.Is(got[0].Err, errUnreachable) {
		t.Fatalf("cluster down: %+v, want errUnreachable", got[0])
	}
	fail = false
	c.maxTopics = 100
	for i := range 1000 {
		c.get(context.Background(), []string{fmt.Sprintf("t%d", i)})
	}
	if n := len(c.topics); n > c.maxTopics {
		t.Fatalf("cache grew to %d entries, bound %d", n, c.maxTopics)
	}
}

// A topic deleted and created again with fewer partitions: the exporter's
// notice of a refused partition drops the cached answer if it still offers
// that partition, so clients are told the new count at their next request
// rather than after MetadataMaxAge; a late refusal beyond the count the
// cache already has changes nothing.
func TestTopicCacheForgetsAShrunkTopic(t *testing.T) {
	asks, n := 0, int32(4)
	c := newTopicCache(func(_ context.Context, names []string) ([]TopicInfo, error) {
		asks++
		out := make([]TopicInfo, len(names))
		for i, name := range names {
			out[i] = TopicInfo{Topic: name, Partitions: n}
		}
		return out, nil
	}, time.Minute)
	if got := c.get(context.Background(), []string{"t"}); got[0].Partitions != 4 || asks != 1 {
		t.Fatalf("first get: %+v, %d asks", got, asks)
	}
	n = 2
	c.forget("t", 5)
	if got := c.get(context.Background(), []string{"t"}); got[0].Partitions != 4 || asks != 1 {
		t.Fatalf("a refusal beyond the cached count dropped it: %+v, %d asks", got, asks)
	}
	c.forget("t", 3)
	if got := c.get(context.Background(), []string{"t"}); got[0].Partitions != 2 || asks != 2 {
		t.Fatalf("after a refusal of partition 3: %+v, %d asks; want the new count, asked again", got, asks)
	}
	c.forget("t", 3) // late: the cache has 2 already
	if got := c.get(context.Background(), []string{"t"}); got[0].Partitions != 2 || asks != 2 {
		t.Fatalf("a late refusal asked again: %+v, %d asks", got, asks)
	}
}

// An ask begun before Kafka refused a partition may answer the old count
// after the refusal: that answer is not kept, the client is told to retry,
// and the topic is asked again once the retry answer expires. An ask begun
// after the refusal is believed, whatever it says.
func TestTopicCacheKeepsNoAnswerFromBeforeARefusal(t *testing.T) {
	var mu sync.Mutex
	asks, n := 0, int32(4)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	block := false
	c := newTopicCache(func(_ context.Context, names []string) ([]TopicInfo, error) {
		mu.Lock()
		asks++
		count, wait := n, block
		mu.Unlock()
		if wait {
			entered <- struct{}{}
			<-release
		}
		if names == nil { // all topics
			names = []string{"t"}
		}
		out := make([]TopicInfo, len(names))
		for i, name := range names {
			out[i] = TopicInfo{Topic: name, Partitions: count}
		}
		return out, nil
	}, time.Minute)
	ctx := context.Background()
	mu.Lock()
	block = true
	mu.Unlock()
	done := make(chan []TopicInfo)
	go func() { done <- c.get(ctx, []string{"t"}) }()
	<-entered // the ask has the old count, 4
	mu.Lock()
	n, block = 2, false
	mu.Unlock()
	c.forget("t", 3)
	close(release)
	if got := <-done; got[0].Err != errUnreachable {
		t.Fatalf("an answer from before the refusal of partition 3 was given: %+v", got)
	}
	// Kept as a retry answer for a moment (no ask per client meanwhile)...
	if got := c.get(ctx, []string{"t"}); got[0].Err != errUnreachable || asks != 1 {
		t.Fatalf("right after: %+v, %d asks", got, asks)
	}
	// ... then asked again, and the new count is kept.
	c.mu.Lock()
	e := c.topics["t"]
	e.at = e.at.Add(-time.Minute)
	c.topics["t"] = e
	c.mu.Unlock()
	if got := c.get(ctx, []string{"t"}); got[0].Partitions != 2 || got[0].Err != nil || asks != 2 {
		t.Fatalf("asked again: %+v, %d asks; want 2 partitions", got, asks)
	}
	// A count asked after the refusal stands even if it offers the
	// refused partition (partitions added again).
	c.forget("t", 1)
	mu.Lock()
	n = 3
	mu.Unlock()
	if got := c.get(ctx, []string{"t"}); got[0].Partitions != 3 || asks != 3 {
		t.Fatalf("an ask after the refusal: %+v, %d asks; want its count, 3", got, asks)
	}
	// A client listing all topics gets no answer from before a refusal
	// either.
	c.forget("t", 2)
	mu.Lock()
	n, block = 3, true
	mu.Unlock()
	release = make(chan struct{})
	all := make(chan []TopicInfo)
	go func() { got, _ := c.allTopics(ctx); all <- got }()
	<-entered
	c.forget("t", 1)
	close(release)
	if got := <-all; len(got) != 1 || got[0].Err != errUnreachable {
		t.Fatalf("all topics, asked before a refusal: %+v", got)
	}
	// Nor can evicting every answer (a client naming many topics), or a
	// late refusal of a higher partition, free an ask begun before a
	// refusal to store the old count.
	c.mu.Lock()
	clear(c.topics)
	c.mu.Unlock()
	mu.Lock()
	n = 3
	mu.Unlock()
	release = make(chan struct{})
	done = make(chan []TopicInfo)
	go func() { done <- c.get(ctx, []string{"t"}) }()
	<-entered // the ask has 3
	c.forget("t", 2)
	c.mu.Lock()
	c.evict(time.Now().Add(time.Hour))
	clear(c.topics)
	c.mu.Unlock()
	c.forget("t", 3)
	close(release)
	if got := <-done; got[0].Err != errUnreachable {
		t.Fatalf("an answer from before a refusal of partition 2, after an eviction and a later refusal of 3: %+v", got)
	}
	c.mu.Lock()
	inflight, marked := len(c.asks), len(c.marks)
	c.mu.Unlock()
	if inflight != 0 || marked != 0 {
		t.Fatalf("with no ask in flight: %d asks and %d marks kept; want none", inflight, marked)
	}
	// Any answer is cached, a topic named "" too (not asked again for
	// every request naming it).
	mu.Lock()
	block = false
	before := asks
	mu.Unlock()
	c.get(ctx, []string{""})
	c.get(ctx, []string{""})
	mu.Lock()
	defer mu.Unlock()
	if asks != before+1 {
		t.Fatalf("two gets of topic \"\" asked the cluster %d times, want 1", asks-before)
	}
}

// The front listens for the exporter's shrink notices from Start to
// Shutdown, and a notice reaches its topic cache.
func TestFrontWatchesShrinks(t *testing.T) {
	var shrinks receivertest.Shrinks
	f := startFront(t, testConfig(), receiver.Env{WatchShrink: shrinks.Watch})
	f.r.topics.get(context.Background(), []string{"t"})
	if !shrinks.Notify("t", 0) {
		t.Fatal("the front did not register for shrink notices")
	}
	f.r.topics.mu.Lock()
	_, cached := f.r.topics.topics["t"]
	f.r.topics.mu.Unlock()
	if cached {
		t.Fatal("a notice for partition 0 left the topic's answer cached")
	}
	if err := f.r.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if shrinks.Watching() {
		t.Fatal("Shutdown left the front watching the exporter")
	}
}
