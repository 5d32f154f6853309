package sampler

import "testing"

func TestValidate(t *testing.T) {
	for _, c := range []Config{{TracesPercent: 101}, {LogsPercent: -1}, {TracesPercent: 50, Tenants: map[string]float64{"a": 200}}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
