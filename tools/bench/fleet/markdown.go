package fleet

import (
	"fmt"
	"strings"
	"time"

	"github.com/ferryhq/ferry/tools/bench/report"
)

// Markdown is the fleet table with how it was measured.
func Markdown(c Config, rep Report) string {
	rows := rep.Rows
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `ferry-bench fleet` on %s, %s, with a %d-broker local cluster (RF %d, min ISR 2) on the same cores.\n",
		time.Now().UTC().Format("2006-01-02"), rep.Machine, c.Nodes, min(3, c.Nodes))
	if rep.IdleBrokerCPU > 0 {
		fmt.Fprintf(&b, "The idle cluster alone takes %.0f%% of a core (three JVMs, KRaft heartbeats); the brokers' CPU below includes it.\n", rep.IdleBrokerCPU)
	}
	if c.ClusterWarmup > 0 {
		fmt.Fprintf(&b, "Before the first row the cluster was warmed up under the same load for %s, not measured (its JVMs compile their hot paths meanwhile).\n", c.ClusterWarmup)
	}
	fmt.Fprintf(&b, "Every row offers the same total: %.0f records/s of %d B, in HTTP requests of %d records answered after Kafka's ack, split evenly over the agents, measured for %s after %s of warm-up (delivered: acknowledged by Kafka in that window; p99: the whole load); topics of %d partitions; compression lz4, acks all, idempotent (the defaults). A linger given as a duration is `linger_mode: fixed`: every batch waits it; *adaptive* is the default (`linger_mode: adaptive`, `linger` 50 ms): a batch leaves at once while no produce request is in flight to its broker and its brokers do not queue, waits for the answer otherwise (or goes in a second request once nothing more has arrived for a quarter of a round trip), and once they queue (a broker's median round trip beyond max(2 × its least, least + 2 ms)) waits longer, up to the cap (50 ms; *adaptive:2ms*: 2 ms, the default until 2026-11-29).\n\n",
		c.Rate, c.Size, c.Batch, c.Duration, c.Warmup, c.Partitions)
	head := []string{"agents", "linger", "delivered rec/s", "failed", "p99 ms", "Produce req/s (all agents)", "Produce req/s per agent",
		"Metadata req/min", "records / batch", "bytes / batch (lz4)", "batches / request", "connections / agent", "agents' CPU %", "brokers' CPU %", "RSS / agent MiB"}
	var cells [][]string
	for _, r := range rows {
		cells = append(cells, []string{fmt.Sprint(r.Agents), r.Linger, fmt.Sprintf("%.0f", r.Delivered), fmt.Sprint(r.Failed),
			fmt.Sprintf("%.0f", r.P99MS), fmt.Sprintf("%.0f", r.ProducePerSec), fmt.Sprintf("%.0f", r.ProducePerSec/float64(r.Agents)),
			fmt.Sprintf("%.1f", r.MetadataPerMin), fmt.Sprintf("%.1f", r.RecordsPerBatch), fmt.Sprintf("%.0f", r.BytesPerBatch),
			fmt.Sprintf("%.2f", r.BatchesPerReq), fmt.Sprintf("%.1f", r.ConnsPerAgent), fmt.Sprintf("%.0f", r.AgentCPU),
			fmt.Sprintf("%.0f", r.BrokerCPU), fmt.Sprintf("%.0f", r.RSSPerAgentMiB)})
	}
	var d report.Doc
	d.Table(head, cells)
	b.WriteString(d.String())
	fmt.Fprintf(&b, "\nReproduce: `make build && bin/ferry-bench fleet --agents %s --lingers %s --rate %.0f --record-size %d --batch %d --duration %s --partitions %d --cluster-warmup %s`\n",
		joinInts(c.Agents), joinLingers(c.Lingers), c.Rate, c.Size, c.Batch, c.Duration, c.Partitions, c.ClusterWarmup)
	return b.String()
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

func joinLingers(v []Linger) string {
	s := make([]string, len(v))
	for i, l := range v {
		s[i] = l.String()
	}
	return strings.Join(s, ",")
}
