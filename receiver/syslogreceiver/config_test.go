package syslogreceiver

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/receiver"
)

// Check names the key of every address that cannot be listened on, before
// the agent starts rather than at Start.
func TestCheckAddresses(t *testing.T) {
	for _, c := range []struct {
		name, want string
		set        func(*Config)
	}{
		{"udp port out of range", "udp:", func(c *Config) { c.UDP = "127.0.0.1:65536" }},
		{"tcp port not a number", "tcp:", func(c *Config) { c.TCP = "127.0.0.1:syslog" }},
		{"tls_listen port negative", "tls_listen:", func(c *Config) { c.TLSListen = "127.0.0.1:-1" }},
		{"tcp and tls_listen on one port", "tls_listen:", func(c *Config) {
			c.TCP, c.TLSListen, c.TLS.CertFile, c.TLS.KeyFile = "127.0.0.1:6514", "127.0.0.1:6514", "c.pem", "k.pem"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			c.set(&cfg)
			errs := cfg.Check(receiver.Bounds{})
			found := false
			for _, err := range errs {
				found = found || strings.HasPrefix(err.Error(), c.want)
			}
			if !found {
				t.Fatalf("no error naming %s: %v", c.want, errs)
			}
		})
	}
	good := testConfig(t)
	if errs := good.Check(receiver.Bounds{}); len(errs) > 0 {
		t.Fatalf("a good config refused: %v", errs)
	}
}
