package routing

import (
	"errors"
	"testing"
)

func TestTemplates(t *testing.T) {
	tm, err := Parse("otel-{signal}-{tenant}")
	if err != nil {
		t.Fatal(err)
	}
	got, err := tm.Expand(Vars{Signal: "traces", Tenant: "shop-eu.1"})
	if err != nil || got != "otel-traces-shop-eu.1" {
		t.Fatalf("%q %v", got, err)
	}
	// Never sanitized: "shop eu/1" would become another tenant's "shop_eu_1".
	var re *ErrRoute
	if _, err := tm.Expand(Vars{Signal: "traces", Tenant: "shop eu/1"}); !errors.As(err, &re) {
		t.Fatalf("a tenant with characters Kafka refuses: %v", err)
	}
	if _, err := tm.Expand(Vars{Signal: "logs"}); !errors.Is(err, ErrNeedsToken) {
		t.Fatalf("no token: %v", err)
	}
	ids, _ := Parse("b{business_id}-d{data_id}")
	if got, _ := ids.Expand(Vars{Tenant: "x", BusinessID: 7, DataID: 1001}); got != "b7-d1001" {
		t.Fatal(got)
	}
	plain, _ := Parse("otlp_spans")
	if !plain.Static() {
		t.Fatal("plain topic not static")
	}
	if got, _ := plain.Expand(Vars{}); got != "otlp_spans" {
		t.Fatal(got)
	}
	for _, bad := range []string{"", "a-{user}", "a-{tenant"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestResourceAndHeaderPlaceholders(t *testing.T) {
	tm, err := Parse("{resource.service.name}.{header.x-env}")
	if err != nil {
		t.Fatal(err)
	}
	if !tm.PerResource() {
		t.Fatal("PerResource")
	}
	got, _ := tm.Expand(Vars{
		Resource: func(k string) (string, bool) { return map[string]string{"service.name": "checkout"}[k], true },
		Header:   func(n string) string { return map[string]string{"x-env": "prod"}[n] },
	})
	if got != "checkout.prod" {
		t.Fatal(got)
	}
	if got, _ := tm.Expand(Vars{}); got != "unknown.unknown" {
		t.Fatal(got)
	}
	if _, err := Parse("{resource.}"); err == nil {
		t.Fatal("empty resource key accepted")
	}
}

// TestValuesNeverBlend: with two free placeholders, a value containing the
// template's separator is refused (it could name the topic of another pair
// of values), and a topic over Kafka's 249 bytes is refused, not cut.
func TestValuesNeverBlend(t *testing.T) {
	tm, err := Parse("t-{tenant}-{header.env}")
	if err != nil {
		t.Fatal(err)
	}
	hdr := func(v string) func(string) string { return func(string) string { return v } }
	if got, err := tm.Expand(Vars{Tenant: "acme", Header: hdr("prod")}); err != nil || got != "t-acme-prod" {
		t.Fatalf("%q %v", got, err)
	}
	var re *ErrRoute
	if got, err := tm.Expand(Vars{Tenant: "acme", Header: hdr("x-prod")}); !errors.As(err, &re) {
		t.Fatalf("acme + x-prod gave %q (the topic of acme-x + prod)", got)
	}
	if _, err := tm.Expand(Vars{Tenant: "acme-x", Header: hdr("prod")}); !errors.As(err, &re) {
		t.Fatal("a tenant containing the separator accepted next to another free value")
	}
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'a'
	}
	one, _ := Parse("otel-{signal}-{tenant}")
	if got, err := one.Expand(Vars{Signal: "logs", Tenant: string(long)}); !errors.As(err, &re) {
		t.Fatalf("a 300-byte tenant gave %d bytes (truncation would merge tenants sharing a prefix)", len(got))
	}
}

// Only a name the configuration knows in full is fixed: literals and
// {signal}; anything a request fills in (token, resource, header) is not.
func TestFixed(t *testing.T) {
	for _, c := range []struct {
		tpl, want string
		ok        bool
	}{
		{"otlp_spans", "otlp_spans", true},
		{"otel-{signal}", "otel-traces", true},
		{"{signal}", "traces", true},
		{"otel-{signal}-{tenant}", "", false},
		{"otel-{resource.service.name}", "", false},
		{"otel-{header.x-topic}", "", false},
		{"t-{business_id}", "", false},
	} {
		tp, err := Parse(c.tpl)
		if err != nil {
			t.Fatal(c.tpl, err)
		}
		got, ok := tp.Fixed("traces")
		if got != c.want || ok != c.ok {
			t.Errorf("Fixed(%q) = %q, %v; want %q, %v", c.tpl, got, ok, c.want, c.ok)
		}
	}
}

func TestFixedTopic(t *testing.T) {
	for topic, want := range map[string]int{"logs": 1, "logs-{file.name}": 0, "a b": 0, "": 0, "syslog": 1} {
		if got := FixedTopic(topic); len(got) != want || want == 1 && got[0] != topic {
			t.Errorf("FixedTopic(%q) = %q", topic, got)
		}
	}
}
