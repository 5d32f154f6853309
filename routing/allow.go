package routing

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/auth/token"
)

// Allow decides which topics a request may write to: the receiver's topics
// patterns (config receivers.<name>.topics; empty or "*" allows any name)
// and, when the request has a token, the token's own topic pattern, on
// every receiver and whatever routing produced the name. Patterns are
// globs: * and ? and [...] as path.Match.
type Allow struct {
	patterns []string
	any      bool
}

// NewAllow checks and keeps patterns.
func NewAllow(patterns []string) (*Allow, error) {
	a := &Allow{}
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("topics: %q is not a valid pattern: %v", p, err)
		}
		if p == "*" {
			a.any = true
		}
		a.patterns = append(a.patterns, p)
	}
	if len(patterns) == 0 {
		a.any = true
	}
	return a, nil
}

// Any reports whether the receiver allows every topic name.
func (a *Allow) Any() bool { return a.any }

// ErrTopicNotAllowed names the pattern a topic failed.
type ErrTopicNotAllowed struct{ Topic, By string }

func (e *ErrTopicNotAllowed) Error() string {
	return fmt.Sprintf("topic %q is not allowed by %s", e.Topic, e.By)
}

// Check returns an *ErrTopicNotAllowed if topic may not be written by the
// holder of c (nil: no token).
func (a *Allow) Check(topic string, c *token.Claims) error {
	if !a.any && !matchAny(a.patterns, topic) {
		return &ErrTopicNotAllowed{Topic: topic, By: "this receiver's topics patterns"}
	}
	if c != nil && c.TopicPattern != "" {
		if ok, _ := path.Match(c.TopicPattern, topic); !ok {
			return &ErrTopicNotAllowed{Topic: topic, By: fmt.Sprintf("this token's topic pattern %q", c.TopicPattern)}
		}
	}
	return nil
}

func matchAny(patterns []string, topic string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, topic); ok {
			return true
		}
	}
	return false
}

// ErrInvalidTopic: a name ValidTopic refuses.
var ErrInvalidTopic = errors.New("invalid topic name")

// FixedTopic is topic as a one-name list when it names one topic in full
// (a valid name, no {placeholder}), for the topics ferry creates; nil for a
// template, whose names depend on what is received.
func FixedTopic(topic string) []string {
	if strings.IndexByte(topic, '{') >= 0 || !ValidTopic(topic) {
		return nil
	}
	return []string{topic}
}

// QuoteTopic quotes a topic name a client sent, for a message: at most
// its first 64 bytes, and its length when it is longer (an invalid name
// can be megabytes, each byte quoted in up to four).
func QuoteTopic(t string) string {
	if len(t) <= 64 {
		return strconv.Quote(t)
	}
	return strconv.Quote(t[:64]) + fmt.Sprintf("… (%d bytes)", len(t))
}

// ValidTopic applies Kafka's rule: 1..249 of [a-zA-Z0-9._-], not "." or "..".
func ValidTopic(t string) bool {
	if len(t) == 0 || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
