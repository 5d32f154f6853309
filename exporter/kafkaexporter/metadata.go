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
// It never creates a topic.
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
	for _, t := range resp.Topics {
		if t.Topic == nil || t.IsInternal {
			continue
		}
		out = append(out, exporter.TopicInfo{Topic: *t.Topic, ID: t.TopicID, Partitions: int32(len(t.Partitions)), Err: kerr.ErrorForCode(t.ErrorCode)})
	}
	return out, nil
}
