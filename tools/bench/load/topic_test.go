package load

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }

// make bench creates the topic its OTLP steps share in each of them: the
// second create must not print Kafka's TOPIC_ALREADY_EXISTS as if the run
// had gone wrong, while a create that is not asked to tolerate it still
// fails.
func TestTopicCreateIfNotExists(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "bench-topic", 1)
	err := TopicCmd([]string{"create", "--bootstrap-server", brokers, "--topic", topic, "--partitions", "3"})
	if !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("create of an existing topic: %v, want TOPIC_ALREADY_EXISTS", err)
	}
	if err := TopicCmd([]string{"create", "--bootstrap-server", brokers, "--topic", topic, "--partitions", "3", "--if-not-exists"}); err != nil {
		t.Fatalf("create --if-not-exists of an existing topic: %v", err)
	}
}
