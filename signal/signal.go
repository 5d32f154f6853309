// Package signal names the kinds of telemetry ferry carries: OTLP traces,
// metrics and logs, and the messages of the HTTP and local receivers. One
// type for all the stages that care (tokens name a topic and a data id per
// signal, the encoder splits per signal, the sampler and the attribute
// filters apply per signal), so a signal is an index on the request path,
// never a string to compare.
package signal

// Signal is a kind of telemetry.
type Signal uint8

// The signals; their order indexes per-signal arrays (tokens' topics and
// data ids), so it is part of the token format and must not change.
const (
	Traces Signal = iota
	Metrics
	Logs
	Messages
	// Count is the number of signals.
	Count
)

var names = [Count]string{"traces", "metrics", "logs", "messages"}

// String is the signal's name as configurations and metrics write it.
func (s Signal) String() string {
	if s < Count {
		return names[s]
	}
	return "unknown"
}

// Parse returns the signal named name.
func Parse(name string) (Signal, bool) {
	for i, n := range names {
		if n == name {
			return Signal(i), true
		}
	}
	return 0, false
}
