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
}

type cachedTopic struct {
	info TopicInfo
	at   time.Time
	// failed: the cluster could not be asked; retried sooner.
	failed bool
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
		if ok && now.Sub(t.at) < c.age(t) {
			out[i] = t.info
			continue
		}
		missing = append(missing, n)
	}
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
			c.topics[n] = cachedTopic{info: t, at: now, failed: true}
		case !ok:
			t = TopicInfo{Topic: n, Err: errUnknownTopic}
			c.topics[n] = cachedTopic{info: t, at: now, failed: true}
		default:
			c.topics[n] = cachedTopic{info: t, at: now, failed: t.Err != nil}
		}
	}
	for i, n := range names {
		out[i] = c.topics[n].info
	}
	return out
}

// forget drops topic's answer when it still offers partition, which Kafka
// refused because the topic no longer has it (deleted and created again
// with fewer: the exporter's notice, receiver.Env.WatchShrink): the next
// metadata request or produce check asks the cluster again, instead of
// offering clients the old partitions for up to MetadataMaxAge. Called
// from the Kafka client's promise goroutine: a short lock, no wait.
func (c *topicCache) forget(topic string, partition int32) {
	c.mu.Lock()
	if t, ok := c.topics[topic]; ok && t.info.Partitions > partition {
		delete(c.topics, topic)
	}
	c.mu.Unlock()
}

// allTopics lists every topic of the cluster (a client asking for all).
func (c *topicCache) allTopics(ctx context.Context) ([]TopicInfo, error) {
	c.mu.Lock()
	if names := c.all; names != nil && time.Since(c.allAt) < c.maxAge {
		c.mu.Unlock()
		return c.get(ctx, names), nil
	}
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
	for _, t := range got {
		names = append(names, t.Topic)
		if len(c.topics) < c.maxTopics {
			c.topics[t.Topic] = cachedTopic{info: t, at: now, failed: t.Err != nil}
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
