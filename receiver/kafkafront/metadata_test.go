package kafkafront

import (
	"context"
	"errors"
	"fmt"
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
