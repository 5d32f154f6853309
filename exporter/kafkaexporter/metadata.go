package kafkaexporter

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/exporter"
)

// Partitions asks the cluster for topics' partition counts (nil: every
// topic), through the exporter's own connections, so that a Kafka-protocol
// client of the agent sees the partitions its records will be written to.
// It never creates a topic. A count is at most the one the Kafka client's
// producer partitions with (producerCounts): partitions added since it
// last refreshed its metadata (every 5 min) are not offered until it has,
// which this asks it to do at once, so a record sent to a partition
// Partitions offered is never refused by the client as unknown.
func (e *Exporter) Partitions(ctx context.Context, topics []string) ([]exporter.TopicInfo, error) {
	req := kmsg.NewPtrMetadataRequest()
	if topics != nil {
		req.Topics = make([]kmsg.MetadataRequestTopic, len(topics))
		for i := range topics {
			req.Topics[i].Topic = kmsg.StringPtr(topics[i])
		}
	}
	resp, err := req.RequestWith(ctx, e.cl)
	if err != nil {
		return nil, err
	}
	out := make([]exporter.TopicInfo, 0, len(resp.Topics))
	behind := false
	for _, t := range resp.Topics {
		if t.Topic == nil || t.IsInternal {
			continue
		}
		n := int32(len(t.Partitions))
		if p := e.seen.get(*t.Topic); p > 0 && p < n {
			n, behind = p, true
		}
		out = append(out, exporter.TopicInfo{Topic: *t.Topic, ID: t.TopicID, Partitions: n, Err: kerr.ErrorForCode(t.ErrorCode)})
	}
	if behind {
		e.refreshMetadata()
	}
	return out, nil
}
