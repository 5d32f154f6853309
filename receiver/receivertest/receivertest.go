// Package receivertest owns test doubles for what a receiver is built with
// (receiver.Env), so each receiver's tests can stand in for the exporter.
package receivertest

import "sync"

// Shrinks stands in for the exporter's notices of topics that lost
// partitions (receiver.Env.WatchShrink): Watch is the Env field, Notify
// plays a refusal.
type Shrinks struct {
	mu sync.Mutex
	fn func(topic string, partition int32)
}

// Watch registers fn (one watcher at a time); stop removes it.
func (s *Shrinks) Watch(fn func(topic string, partition int32)) (stop func()) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.fn = nil
		s.mu.Unlock()
	}
}

// Notify tells the watcher that Kafka refused partition of topic; false if
// nobody watches.
func (s *Shrinks) Notify(topic string, partition int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fn == nil {
		return false
	}
	s.fn(topic, partition)
	return true
}

// Watching reports whether a watcher is registered.
func (s *Shrinks) Watching() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fn != nil
}
