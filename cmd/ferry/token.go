package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/config"
)

const tokenUsage = `ferry token — application tokens (docs/tokens.md)

  ferry token keygen                         print a new random 32-byte key (base64)
  ferry token issue -c FILE --app NAME [--expires 720h|2027-01-01] [--topic SIGNAL=TOPIC ...]
                    [--data-id SIGNAL=ID ...] [--business-id N] [--rate-class NAME]
                    [--topic-pattern GLOB]   (every topic written must match, e.g. 'acme-*')
  ferry token inspect -c FILE TOKEN          verify a token and print what it says

Keys come from the configuration's auth.keys (the one with issue: true signs).
Signals: traces, metrics, logs, messages.
`

func tokenCmd(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, tokenUsage)
		return 2
	}
	switch args[0] {
	case "keygen":
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			fmt.Fprintln(os.Stderr, "ferry:", err)
			return 1
		}
		fmt.Println(base64.StdEncoding.EncodeToString(k))
		return 0
	case "issue", "inspect":
	default:
		fmt.Fprint(os.Stderr, tokenUsage)
		return 2
	}
	fs := flag.NewFlagSet("token "+args[0], flag.ContinueOnError)
	file := fs.String("c", "", "configuration file with auth.keys")
	var s sets
	fs.Var(&s, "set", "override one key: key.path=value (repeatable)")
	app := fs.String("app", "", "tenant / application name")
	expires := fs.String("expires", "", "lifetime (720h) or date (2027-01-01, RFC 3339)")
	business := fs.Uint64("business-id", 0, "business id")
	rateClass := fs.String("rate-class", "", "rate-limit class")
	topicPattern := fs.String("topic-pattern", "", "glob every topic the token writes to must match (e.g. 'acme-*')")
	var topics, dataIDs sets
	fs.Var(&topics, "topic", "SIGNAL=TOPIC (repeatable)")
	fs.Var(&dataIDs, "data-id", "SIGNAL=ID (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	cfg, err := config.Load(*file, s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry:", err)
		return 1
	}
	if len(cfg.Auth.Keys) == 0 {
		fmt.Fprintln(os.Stderr, "ferry: no auth.keys configured (add one: ferry token keygen)")
		return 1
	}
	ring, err := cfg.Auth.Keyring()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry:", err)
		return 1
	}
	if args[0] == "inspect" {
		if fs.NArg() != 1 {
			fmt.Fprintln(os.Stderr, "usage: ferry token inspect -c FILE TOKEN")
			return 2
		}
		c, err := ring.Verify(fs.Arg(0), time.Now())
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry:", err)
			if c.App != "" { // expired: still say whose it was
				fmt.Print(c.String())
			}
			return 1
		}
		fmt.Print(c.String())
		return 0
	}
	c := token.Claims{App: *app, BusinessID: *business, RateClass: *rateClass, TopicPattern: *topicPattern}
	if _, err := path.Match(c.TopicPattern, ""); err != nil {
		fmt.Fprintf(os.Stderr, "ferry: --topic-pattern %q: %v\n", c.TopicPattern, err)
		return 2
	}
	if *expires != "" {
		if c.Expires, err = parseExpiry(*expires, time.Now()); err != nil {
			fmt.Fprintln(os.Stderr, "ferry: --expires:", err)
			return 2
		}
	}
	for _, t := range topics {
		sig, topic, ok := strings.Cut(t, "=")
		i := token.SignalIndex(sig)
		if !ok || i < 0 || topic == "" {
			fmt.Fprintf(os.Stderr, "ferry: --topic %q: want SIGNAL=TOPIC with SIGNAL one of %v\n", t, token.SignalNames)
			return 2
		}
		c.Topics[i] = topic
	}
	for _, d := range dataIDs {
		sig, id, ok := strings.Cut(d, "=")
		i := token.SignalIndex(sig)
		n, perr := strconv.ParseUint(id, 10, 64)
		if !ok || i < 0 || perr != nil || n == 0 {
			fmt.Fprintf(os.Stderr, "ferry: --data-id %q: want SIGNAL=ID with a positive ID\n", d)
			return 2
		}
		c.DataIDs[i] = n
	}
	tok, err := ring.Issue(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry:", err)
		return 1
	}
	fmt.Println(tok)
	return 0
}

func parseExpiry(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, errors.New("must be in the future")
		}
		return now.Add(d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			if !t.After(now) {
				return time.Time{}, errors.New("must be in the future")
			}
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither a duration (720h) nor a date (2027-01-01)", s)
}
