package pipeline

import (
	"context"
	"errors"
	"fmt"
)

// Component is what the pipeline starts and stops. Start may fail (a port
// taken, a file unreadable); Shutdown is called only for components whose
// Start succeeded, once, in the reverse order of starting, and must return
// once ctx ends.
type Component interface {
	Start(context.Context) error
	Shutdown(context.Context) error
}

// step adapts functions to Component, for stages whose start or stop is
// not a plain method (the spool's reader, the report loop).
type step struct {
	start func(context.Context) error
	stop  func(context.Context) error
}

func (s step) Start(ctx context.Context) error {
	if s.start == nil {
		return nil
	}
	return s.start(ctx)
}

func (s step) Shutdown(ctx context.Context) error {
	if s.stop == nil {
		return nil
	}
	return s.stop(ctx)
}

type named struct {
	name string
	c    Component
}

// lifecycle is the ordered list of components: started front to back, so
// nothing accepts data before the stage behind it runs; stopped back to
// front; a failed start stops what had started, in reverse.
type lifecycle struct {
	list    []named
	started int
}

func (l *lifecycle) add(name string, c Component) { l.list = append(l.list, named{name, c}) }

func (l *lifecycle) start(ctx context.Context) error {
	for i, n := range l.list {
		if err := n.c.Start(ctx); err != nil {
			_ = l.shutdown(ctx)
			return fmt.Errorf("%s: %w", n.name, err)
		}
		l.started = i + 1
	}
	return nil
}

// shutdown stops every started component, last first, and joins their
// errors. It is safe to call again (nothing is stopped twice).
func (l *lifecycle) shutdown(ctx context.Context) error {
	var errs []error
	for ; l.started > 0; l.started-- {
		n := l.list[l.started-1]
		if err := n.c.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
		}
	}
	return errors.Join(errs...)
}
