// Package compat tests ferry with unmodified clients of other systems: the
// Kafka-protocol front (receivers.kafka) against franz-go, Kafka's own Java
// tools (the console producer and ProducerPerformance, from the same Maven
// jars as the local broker) and librdkafka (the confluent-kafka Python
// wheel), each producing through the real ferry binary into a real broker,
// with the records read back from the broker.
package compat
