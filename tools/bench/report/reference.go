package report

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// reference.json holds the published figures of the systems ferry is set
// beside, each with where it comes from; the suite measures ferry (and,
// where one exists, the reference tool itself) on this machine next to them.
//
//go:embed reference.json
var referenceJSON []byte

// Reference is reference.json.
type Reference struct {
	Pan struct {
		Source       string          `json:"source"`
		Cores        int             `json:"cores"`
		PerSecBySize map[int]float64 `json:"per_sec_by_size"`
	} `json:"pan"`
	KafkaProducer struct {
		Source       string          `json:"source"`
		PerSecBySize map[int]float64 `json:"per_sec_by_size"`
	} `json:"kafka_producer_perf"`
	KafkaConsumer   ConsumerLine `json:"kafka_consumer_perf"`
	BKCollectorHTTP struct {
		Source    string             `json:"source"`
		Cores     int                `json:"cores"`
		ReqPerSec map[string]float64 `json:"req_per_sec"`
	} `json:"bk_collector_http"`
	BKCollectorMicro struct {
		Source string                `json:"source"`
		Rows   map[string][2]float64 `json:"rows"` // ns/op, allocs/op
	} `json:"bk_collector_micro"`
	PanClient struct {
		Source  string          `json:"source"`
		NsPerOp map[int]float64 `json:"ns_per_op"`
	} `json:"pan_client"`
	// JavaSDKTables: rows of [setting, raw MB/s, compressed MB/s, CPU %].
	JavaSDKTables struct {
		Source      string       `json:"source"`
		SendThreads [][4]float64 `json:"send_threads"`
		TotalSize   [][4]float64 `json:"total_size_in_bytes"`
		BatchSize   [][4]float64 `json:"batch_size_in_bytes"`
	} `json:"java_sdk_tables"`
	JavaSDK struct {
		Source     string  `json:"source"`
		MBPerSec   float64 `json:"mb_per_sec"`
		CPUPercent float64 `json:"cpu_percent"`
	} `json:"java_sdk"`
}

// ConsumerLine is one data line of Kafka's ConsumerPerformance output.
type ConsumerLine struct {
	Source       string  `json:"source,omitempty"`
	MB           float64 `json:"mb"`
	MBSec        float64 `json:"mb_sec"`
	NMsg         float64 `json:"n_msg"`
	NMsgSec      float64 `json:"n_msg_sec"`
	RebalanceMS  float64 `json:"rebalance_ms"`
	FetchMS      float64 `json:"fetch_ms"`
	FetchMBSec   float64 `json:"fetch_mb_sec"`
	FetchNMsgSec float64 `json:"fetch_n_msg_sec"`
}

// Ref is the reference figures, read once.
var Ref = func() Reference {
	var r Reference
	if err := json.Unmarshal(referenceJSON, &r); err != nil {
		panic(fmt.Sprintf("report: reference.json: %v", err))
	}
	return r
}()
