package config

import (
	"os"
	"regexp"
	"testing"

	"github.com/ferryhq/ferry/exporter/kafkaexporter"
)

// Every YAML example of docs/kafka-security.md is a configuration the
// agent accepts (the files it names are not read here: that is `ferry
// validate`'s job on the host).
func TestKafkaSecurityExamplesLoad(t *testing.T) {
	doc, err := os.ReadFile("../docs/kafka-security.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) < 5 {
		t.Fatalf("%d YAML examples in docs/kafka-security.md, want every mechanism's", len(blocks))
	}
	for i, b := range blocks {
		c, err := Parse(b[1], nil)
		if err != nil {
			t.Errorf("example %d: %v\n%s", i+1, err, b[1])
			continue
		}
		if k, ok := c.Exporter.Config("kafka").(*kafkaexporter.Config); !ok || k.SASL.Mechanism == "" {
			t.Errorf("example %d sets no SASL mechanism", i+1)
		}
	}
}
