// Package hostile holds ferry's hostile-client tests: the real ferry binary
// and a real Kafka broker, and every attack of the hostile-input review
// (proofs/harness/payloads builds them) thrown at it over the network while
// a well-behaved client keeps sending records with sequence ids. Each attack
// must get a 4xx (or RESOURCE_EXHAUSTED) naming its reason, the process
// must stay up with its peak RSS within queue.memory_limit + 64 MiB, nothing
// the attacker forged may reach Kafka, and the well-behaved client must
// lose nothing. make test runs them; make hostile runs them too and rewrites
// the table in docs/reliability.md with what they measured.
package hostile
