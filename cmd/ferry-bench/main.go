// Command ferry-bench is ferry's load tool, so that every figure ferry claims
// can be reproduced on the user's own machine.
//
//	ferry-bench produce --target http://127.0.0.1:8088 | kafka://127.0.0.1:9092 [flags]
//	ferry-bench consume --topic T [--messages N] [--expect N]
//	ferry-bench topic create|delete --topic T [--partitions N] [--if-not-exists]
//	ferry-bench suite [--quick]     the whole benchmark report (make bench)
//	ferry-bench fleet               N agents against one cluster (docs/scaling.md)
//
// produce takes Kafka ProducerPerformance's flags and prints its final line.
//
// The commands live in tools/bench: load (produce, consume, topic, otlp),
// verify (sequence ids and the delivery check), report (tables, charts, the
// reference figures), suite (the whole report) and fleet (many agents
// against one cluster).
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/ferryhq/ferry/tools/bench/fleet"
	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/report"
	"github.com/ferryhq/ferry/tools/bench/suite"
)

const usage = `ferry-bench — load and verification tool for ferry

  ferry-bench produce [--target http://127.0.0.1:8088|kafka://127.0.0.1:9092 | --bootstrap-server H:P] [--topic T]
                      [--num-records N] [--record-size B | --payload-file F] [--throughput R|-1] [--duration D]
                      [--batch N] [--concurrency C] [--keys] [--seq] [--producer-props k=v ...]
                      [--print-metrics] [--report-json F]
  ferry-bench consume [--bootstrap-server H:P] --topic T [--num-records N] [--timeout D|ms] [--expect N]
                      [--verify [--produced F]] [--report-json F]
  ferry-bench topic create|delete --topic T [--partitions N] [--if-not-exists] [--bootstrap-server H:P]
  ferry-bench otlp [--target http://127.0.0.1:4318] [--signal logs|traces|metrics] [--count N]
                   [--length B] [--requests N] [--concurrency C] [--json] [--exporter NAME]
  ferry-bench table --via F --direct F --consumed F [--agent-cpu P] [--agent-rss-kb K]
  ferry-bench suite [--quick] [--out BENCHMARKS.md] [--charts docs/bench]   (make bench, make bench-quick)
  ferry-bench fleet [--agents 1,4,16] [--lingers 5ms,50ms] [--rate R] [--record-size B] [--batch N]
                    [--duration D] [--cluster-warmup 90s] [--brokers H:P,... | --port P --nodes 3] [--out docs/scaling.md]

Run a command with -h for every flag.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	// FERRY_BENCH_CPUPROFILE=FILE writes the tool's own CPU profile: whether
	// the load generator, not the agent, is the limit of a figure is a
	// question every benchmark table has to answer.
	if f := os.Getenv("FERRY_BENCH_CPUPROFILE"); f != "" {
		out, err := os.Create(f)
		if err == nil {
			err = pprof.StartCPUProfile(out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry-bench: FERRY_BENCH_CPUPROFILE:", err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); out.Close() }()
	}
	var err error
	switch os.Args[1] {
	case "produce":
		err = load.ProduceCmd(os.Args[2:])
	case "consume":
		err = load.ConsumeCmd(os.Args[2:])
	case "topic":
		err = load.TopicCmd(os.Args[2:])
	case "table":
		err = report.TableCmd(os.Args[2:])
	case "otlp":
		err = load.OTLPCmd(os.Args[2:])
	case "fleet":
		err = fleet.Cmd(os.Args[2:])
	case "suite":
		err = suite.Cmd(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "ferry-bench: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry-bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
