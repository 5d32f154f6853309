package kafkafront

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
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
