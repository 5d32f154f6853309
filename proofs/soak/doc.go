// Package soak is ferry's randomized fault soak with a checker: the real
// binary, a real 3-broker Kafka cluster (scripts/kafka-local, replication
// factor 3, min.insync.replicas 2) and real clients, under faults drawn from
// a seed, then a read_committed consumer that checks every id.
//
// Load. Every record's value is "<source>:<seq>:" plus padding; each source
// numbers its records 0, 1, 2, ... and never reuses an id. The sources are
// two HTTP clients (POST /v1/messages, NDJSON batches), the Go client
// (client/, the local protocol over TCP), the Java SDK (sdk/java, the local
// protocol) and Apache Kafka's own Java producer (kafka-clients,
// enable.idempotence, acks=all) through ferry's Kafka front; both Java
// producers run in one JVM (testdata/Soak.java). Every source
// authenticates with an application token, so a key rotation is a fault
// the clients live through. Each source records the ids the agent
// acknowledged (HTTP 200, a successful callback).
//
// Faults. Clients reach the agent through TCP proxies of the test's own,
// so that the agent can be restarted on new ports behind them and so that
// connections can be cut mid-request. A scheduler seeded by
// FERRY_SOAK_SEED (printed at the start and on any failure; a random one
// if unset) draws one fault at a time, its target and its length, with a
// random gap between faults:
//
//   - agent-kill: SIGKILL, and a new agent on the same spool after 0-2 s;
//   - broker-kill: a random broker SIGKILLed, restarted on its data 3-10 s later
//     (2-5 s in the short version, as for every fault below that lasts);
//   - broker-pause: a random broker SIGSTOPped for 3-10 s;
//   - cut: every client connection cut (RST) wherever it is;
//   - spool-full: the spool's disk (a tmpfs of its own, root only) filled
//     for 3-10 s (spool, spill and exactly_once modes);
//   - rotate: a new signing key, the oldest of three dropped, the config
//     file rewritten and SIGHUP; clients move to a token of the new key;
//   - netem: delay and loss on the traffic to the brokers' ports (tc netem
//     on lo, root only, and only when the kernel has the netem and prio
//     qdiscs; otherwise skipped with a message saying why).
//
// The seed fixes the schedule (which fault, when, on what, for how long);
// the load's interleaving with it is the machine's, so a failure found with
// a seed is reproduced with the same seed in the same conditions with high
// but not certain odds.
//
// Checker. After the load and the faults stop, every broker is up: a
// consumer with isolation read_committed reads the topic until every
// acknowledged id is there (or a timeout) and a few seconds more. Then:
// an acknowledged id must be there at least once (exactly once with
// delivery.guarantee exactly_once); an id never acknowledged at most once
// in exactly_once mode (other modes: counted); an id never offered, never.
// Duplicates are counted and reported in every mode.
//
// Leak check. Every second (a quarter second in the short version) the agent's RSS, goroutines (go_goroutines on
// /metrics), open files (/proc/PID/fd) and spool bytes are sampled. After a
// warm-up (the first quarter), the median of the last fifth must be within
// the stated tolerance of the median of the fifth after the warm-up; after
// the drain the spool must be back to a few segments.
//
// Modes: kafka, spool, spill, exactly_once (delivery.guarantee, with
// delivery.mode spool); exactly_once is skipped, saying so, by an agent
// whose `ferry config default` has no delivery.guarantee.
//
// make test runs the short version (FERRY_SOAK_DURATION unset: 15 s a
// mode); make soak DURATION=30m [MODES=spool,kafka] runs the long one with a
// progress line every 10 s and writes its table into docs/reliability.md.
package soak
