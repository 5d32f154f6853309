// Package faults holds ferry's fault tests: real Kafka (scripts/kafka-local),
// the real ferry binary, load with sequence ids, then a consumer that checks
// every acknowledged record is in Kafka. make test runs the short versions;
// make faults runs the full ones (FERRY_FAULTS=full) and rewrites the table
// in docs/reliability.md with what they measured.
package faults
