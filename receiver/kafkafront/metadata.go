package kafkafront

import (
	"context"
	"sync"
	"time"

	"github.com/ferryhq/ferry/receiver"
)

// TopicInfo is one real topic as the cluster describes it.
type TopicInfo = receiver.TopicInfo

// Cluster asks the real cluster for topics' partitions (nil: all topics).
// The pipeline passes the exporter's (receiver.Env.Topics), so the front
// mirrors the cluster its records go to, over connections ferry already
// has.
type Cluster = receiver.Topics

// topicCache keeps the cluster's answers for MetadataMaxAge, so that the
// metadata every producer asks for (at start, then every
// metadata.max.age.ms) and the partition check of every produce request
// cost the cluster one request per topic per period, not one per client.
type topicCache struct {
	ask    Cluster
	maxAge time.Duration
	// maxTopics bounds the cache: names come from clients.
	maxTopics int

	mu     sync.Mutex
	topics map[string]cachedTopic
	all    []string
	allAt  time.Time
	// An ask of the cluster begun before Kafka refused one of a topic's
	// partitions (forget) may answer the old count after it. shrinks
	// counts refusals; asks holds, for each ask in flight, shrinks when
	// it began; marks, per topic, the last refusal an ask in flight began
	// before. Marks are kept apart from topics, so that neither eviction
	// nor a client's names can drop one, and only while such an ask
	// runs (end), so they stay few.
	shrinks uint64
	asks    map[uint64]int
	marks   map[string]refusal
}

type cachedTopic struct {
	info TopicInfo
	at   time.Time
	// failed: the cluster could not be asked; retried sooner.
	failed bool
}

// refusal: Kafka refused partition (or one above it) of a topic when
// shrinks was at.
type refusal struct {
	at        uint64
	partition int32
}

func newTopicCache(ask Cluster, maxAge time.Duration) *topicCache {
	return &topicCache{ask: ask, maxAge: maxAge, maxTopics: 10000, topics: map[string]cachedTopic{},
		asks: map[uint64]int{}, marks: map[string]refusal{}}
}

// get returns the topics' infos, asking the cluster for those not known
// or too old. A topic the cluster could not be asked about comes back with
// Err errUnreachable (retriable for the client).
func (c *topicCache) get(ctx context.Context, names []string) []TopicInfo {
	now := time.Now()
	out := make([]TopicInfo, len(names))
	var missing []string
	var at []int // names[at[j]] is missing[j]
	c.mu.Lock()
	for i, n := range names {
		t, ok := c.topics[n]
		if ok && now.Sub(t.at) < c.age(t) {
			out[i] = t.info
			continue
		}
		missing, at = append(missing, n), append(at, i)
	}
	if len(missing) == 0 {
		c.mu.Unlock()
		return out
	}
	since := c.begin()
	c.mu.Unlock()
	got, err := c.ask(ctx, missing)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.end(since)
	if len(c.topics)+len(missing) > c.maxTopics {
		c.evict(now)
	}
	found := make(map[string]TopicInfo, len(got))
	for _, t := range got {
		found[t.Topic] = t
	}
	for j, n := range missing {
		t, ok := found[n]
		switch {
		case err != nil:
			t = TopicInfo{Topic: n, Err: errUnreachable}
		case !ok:
			t = TopicInfo{Topic: n, Err: errUnknownTopic}
		}
		out[at[j]] = c.put(t, since, now)
	}
	return out
}

// begin notes an ask about to start and returns shrinks (mu held).
func (c *topicCache) begin() uint64 {
	c.asks[c.shrinks]++
	return c.shrinks
}

// end notes the end of the ask begun at since; once none is in flight,
// no mark matters any more (mu held). Marks older than every ask in
// flight are harmless meanwhile: put compares them with the ask's start.
func (c *topicCache) end(since uint64) {
	if c.asks[since]--; c.asks[since] <= 0 {
		delete(c.asks, since)
	}
	if len(c.asks) == 0 {
		clear(c.marks)
	}
}

// put keeps the cluster's answer t, from an ask begun when shrinks was
// since (mu held). An answer that still offers a partition Kafka refused
// after the ask began is from before the topic shrank: the client is told
// to retry (errUnreachable), and the topic is asked again once that
// expires, as failed answers are.
func (c *topicCache) put(t TopicInfo, since uint64, now time.Time) TopicInfo {
	t = c.current(t, since)
	c.topics[t.Topic] = cachedTopic{info: t, at: now, failed: t.Err != nil}
	return t
}

// current is t, or the retry answer if t is from before a refusal (put).
func (c *topicCache) current(t TopicInfo, since uint64) TopicInfo {
	if m, ok := c.marks[t.Topic]; ok && m.at > since && t.Err == nil && t.Partitions > m.partition {
		return TopicInfo{Topic: t.Topic, Err: errUnreachable}
	}
	return t
}

// forget drops topic's answer when it still offers partition, which Kafka
// refused because the topic no longer has it (deleted and created again
// with fewer: the exporter's notice, receiver.Env.WatchShrink): the next
// metadata request or produce check asks the cluster again, instead of
// offering clients the old partitions for up to MetadataMaxAge. An answer
// already below partition stays (a late refusal of records placed
// before). While asks are in flight, the refusal is marked, so that one
// begun before it cannot store the old count back (put); a second
// refusal keeps the lower partition. Called from the Kafka client's
// promise goroutine: a short lock, no wait.
func (c *topicCache) forget(topic string, partition int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.topics[topic]; ok && t.info.Err == nil && t.info.Partitions > partition {
		delete(c.topics, topic)
	}
	if len(c.asks) == 0 {
		return // every later ask begins after this refusal
	}
	m, marked := c.marks[topic]
	if !marked && len(c.marks) >= c.maxTopics {
		// As many marks as topics the cache holds: refusals come from
		// Kafka, for topics ferry wrote to, so this is a cluster of
		// topics shrinking at once; the next refusal drops a stale count.
		return
	}
	if marked {
		partition = min(partition, m.partition)
	}
	c.shrinks++
	c.marks[topic] = refusal{at: c.shrinks, partition: partition}
}

// allTopics lists every topic of the cluster (a client asking for all).
func (c *topicCache) allTopics(ctx context.Context) ([]TopicInfo, error) {
	c.mu.Lock()
	if names := c.all; names != nil && time.Since(c.allAt) < c.maxAge {
		c.mu.Unlock()
		return c.get(ctx, names), nil
	}
	since := c.begin()
	c.mu.Unlock()
	got, err := c.ask(ctx, nil)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.end(since)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(got))
	now := time.Now()
	if len(c.topics)+len(got) > c.maxTopics {
		c.evict(now)
	}
	for i, t := range got {
		names = append(names, t.Topic)
		if _, ok := c.topics[t.Topic]; ok || len(c.topics) < c.maxTopics {
			got[i] = c.put(t, since, now)
		} else {
			got[i] = c.current(t, since)
		}
	}
	c.all, c.allAt = names, now
	return got, nil
}

// age: answers that say a topic is missing or unreachable are kept
// briefly, so a topic created a moment later is found soon, while a
// client retrying an unknown topic cannot turn into a flood on the cluster.
func (c *topicCache) age(t cachedTopic) time.Duration {
	if t.failed {
		return min(c.maxAge, 2*time.Second)
	}
	return c.maxAge
}

// evict drops expired entries, then everything if still full (called with
// mu held; the next requests simply ask again).
func (c *topicCache) evict(now time.Time) {
	for n, t := range c.topics {
		if now.Sub(t.at) >= c.age(t) {
			delete(c.topics, n)
		}
	}
	if len(c.topics) >= c.maxTopics/2 {
		clear(c.topics)
	}
}
