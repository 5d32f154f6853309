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
	got, err := tm.Expand(Vars{Signal: "traces", Tenant: "shop eu/1"})
	if err != nil || got != "otel-traces-shop_eu_1" {
		t.Fatalf("%q %v", got, err)
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
