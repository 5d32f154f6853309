package telemetry

import "sync"

// Health collects readiness checks from components. A component registers a
// function that returns nil when it is ready or an error saying why not.
type Health struct {
	mu     sync.Mutex
	checks map[string]func() error
}

// NewHealth returns an empty set of checks (ready).
func NewHealth() *Health { return &Health{checks: map[string]func() error{}} }

// Register adds or replaces the check named name.
func (h *Health) Register(name string, check func() error) {
	h.mu.Lock()
	h.checks[name] = check
	h.mu.Unlock()
}

// Ready runs every check and returns the failures by name.
func (h *Health) Ready() (bool, map[string]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]string{}
	for name, c := range h.checks {
		if err := c(); err != nil {
			out[name] = err.Error()
		}
	}
	return len(out) == 0, out
}
