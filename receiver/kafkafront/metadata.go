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
	// shrinks counts forget's marks, so that an answer can tell whether
	// its ask began before one.
	shrinks uint64
}

type cachedTopic struct {
	// info is the answer given to clients; none (info.Topic "") while
	// the entry only marks a refusal.
	info TopicInfo
	at   time.Time
	// failed: the cluster could not be asked; retried sooner.
	failed bool
	// mark, when not 0, is the shrinks count at which Kafka last refused
	// partition refused of this topic (forget): an answer to an ask begun
	// before it that still offers that partition is from before the
	// topic shrank and is not kept.
	mark    uint64
	refused int32
}

func newTopicCache(ask Cluster, maxAge time.Duration) *topicCache {
	return &topicCache{ask: ask, maxAge: maxAge, maxTopics: 10000, topics: map[string]cachedTopic{}}
}

// get returns the topics' infos, asking the cluster for those not known
// or too old. A topic the cluster could not be asked about comes back with
// Err errUnreachable (retriable for the client).
func (c *topicCache) get(ctx context.Context, names []string) []TopicInfo {
	now := time.Now()
	out := make([]TopicInfo, len(names))
	var missing []string
	c.mu.Lock()
	for i, n := range names {
		t, ok := c.topics[n]
		if ok && t.info.Topic != "" && now.Sub(t.at) < c.age(t) {
			out[i] = t.info
			continue
		}
		missing = append(missing, n)
	}
	since := c.shrinks
	c.mu.Unlock()
	if len(missing) == 0 {
		return out
	}
	got, err := c.ask(ctx, missing)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.topics)+len(got) > c.maxTopics {
		c.evict(now)
	}
	found := make(map[string]TopicInfo, len(got))
	for _, t := range got {
		found[t.Topic] = t
	}
	for _, n := range missing {
		t, ok := found[n]
		switch {
		case err != nil:
			t = TopicInfo{Topic: n, Err: errUnreachable}
		case !ok:
			t = TopicInfo{Topic: n, Err: errUnknownTopic}
		}
		c.put(t, since, now)
	}
	for i, n := range names {
		if out[i].Topic == "" { // asked now: its entry was just put
			out[i] = c.topics[n].info
		}
	}
	return out
}

// put keeps the cluster's answer t, from an ask begun when shrinks was
// since (called with mu held). An answer that still offers a partition
// Kafka refused after the ask began is from before the topic shrank: the
// client is told to retry (errUnreachable), and the topic is asked again
// once that expires, as failed answers are.
func (c *topicCache) put(t TopicInfo, since uint64, now time.Time) {
	cur := c.topics[t.Topic]
	if cur.mark > since && t.Err == nil && t.Partitions > cur.refused {
		t = TopicInfo{Topic: t.Topic, Err: errUnreachable}
	}
	c.topics[t.Topic] = cachedTopic{info: t, at: now, failed: t.Err != nil, mark: cur.mark, refused: cur.refused}
}

// forget drops topic's answer when it still offers partition, which Kafka
// refused because the topic no longer has it (deleted and created again
// with fewer: the exporter's notice, receiver.Env.WatchShrink): the next
// metadata request or produce check asks the cluster again, instead of
// offering clients the old partitions for up to MetadataMaxAge. An answer
// already below partition stays (a late refusal of records placed
// before). The entry keeps a mark of the refusal, so that an ask begun
// before it cannot store the old count back (put). Called from the Kafka
// client's promise goroutine: a short lock, no wait.
func (c *topicCache) forget(topic string, partition int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.topics[topic]
	switch {
	case ok && t.info.Topic != "" && t.info.Err == nil && t.info.Partitions <= partition:
		return
	case ok && t.info.Topic == "" && t.mark != 0 && t.refused <= partition:
		return // marked already, at a partition as low
	case !ok && len(c.topics) >= c.maxTopics:
		c.evict(time.Now())
	}
	c.shrinks++
	c.topics[topic] = cachedTopic{at: time.Now(), failed: true, mark: c.shrinks, refused: partition}
}

// allTopics lists every topic of the cluster (a client asking for all).
func (c *topicCache) allTopics(ctx context.Context) ([]TopicInfo, error) {
	c.mu.Lock()
	if names := c.all; names != nil && time.Since(c.allAt) < c.maxAge {
		c.mu.Unlock()
		return c.get(ctx, names), nil
	}
	since := c.shrinks
	c.mu.Unlock()
	got, err := c.ask(ctx, nil)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(got))
	now := time.Now()
	c.mu.Lock()
	if len(c.topics)+len(got) > c.maxTopics {
		c.evict(now)
	}
	for i, t := range got {
		names = append(names, t.Topic)
		if _, ok := c.topics[t.Topic]; ok || len(c.topics) < c.maxTopics {
			c.put(t, since, now)
			got[i] = c.topics[t.Topic].info
		}
	}
	c.all, c.allAt = names, now
	c.mu.Unlock()
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
