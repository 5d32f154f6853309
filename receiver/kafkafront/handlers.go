package kafkafront

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/receiver"
)

// maxMetadataTopics bounds the topics one Metadata request may name (a
// producer names the few it writes to).
const maxMetadataTopics = 1000

// onlyNode is every partition's replica set: ferry alone.
var onlyNode = []int32{nodeID}

// metadata presents ferry as the single broker leading every partition of
// the real topics the client may write to.
func (cn *conn) metadata(req *kmsg.MetadataRequest, corr int32) *connErr {
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	resp.SetVersion(req.Version)
	host, port := cn.r.advertised()
	resp.Brokers = []kmsg.MetadataResponseBroker{{NodeID: nodeID, Host: host, Port: port}}
	resp.ClusterID = ptr("ferry")
	resp.ControllerID = nodeID
	ctx, cancel := context.WithTimeout(cn.ctx, 5*time.Second)
	defer cancel()
	var infos []TopicInfo
	if req.Topics == nil {
		all, err := cn.r.topics.allTopics(ctx)
		if err != nil {
			cn.r.m.Error("kafka_unavailable")
		}
		for _, t := range all {
			if cn.check(t.Topic) == nil {
				infos = append(infos, t)
			}
		}
	} else {
		names := make([]string, 0, len(req.Topics))
		for _, t := range req.Topics {
			if t.Topic == nil {
				// By topic id only: ferry knows topics by name.
				resp.Topics = append(resp.Topics, kmsg.MetadataResponseTopic{ErrorCode: kerr.UnknownTopicID.Code, TopicID: t.TopicID})
				continue
			}
			if err := cn.check(*t.Topic); err != nil {
				resp.Topics = append(resp.Topics, kmsg.MetadataResponseTopic{Topic: t.Topic, ErrorCode: codeFor(err).Code})
				continue
			}
			names = append(names, *t.Topic)
		}
		infos = cn.r.topics.get(ctx, names)
	}
	for _, t := range infos {
		rt := kmsg.MetadataResponseTopic{Topic: ptr(t.Topic), TopicID: t.ID}
		if t.Err != nil {
			cn.r.set.Logger.Debug("metadata: topic answered with an error", "component", "receiver/kafka", "topic", t.Topic, "err", t.Err)
			rt.ErrorCode = codeFor(t.Err).Code
			var ke *kerr.Error
			if errors.As(t.Err, &ke) {
				rt.ErrorCode = ke.Code
			}
		} else {
			rt.Partitions = make([]kmsg.MetadataResponseTopicPartition, t.Partitions)
			for i := range rt.Partitions {
				p := &rt.Partitions[i]
				*p = kmsg.NewMetadataResponseTopicPartition()
				p.Partition, p.Leader, p.LeaderEpoch = int32(i), nodeID, 0
				p.Replicas, p.ISR = onlyNode, onlyNode
			}
		}
		resp.Topics = append(resp.Topics, rt)
	}
	cn.answerNow(corr, resp)
	return nil
}

// check refuses a topic this connection may not write to.
func (cn *conn) check(topic string) error { return receiver.CheckTopic(cn.r.allow, cn.claims, topic) }
