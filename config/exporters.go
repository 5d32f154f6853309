package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/exporter/blackholeexporter"
	"github.com/ferryhq/ferry/exporter/kafkaexporter"
)

// exporterFactories are the exporters ferry is built with, in the order
// their sections appear in `ferry config default`. Adding an exporter is
// its package and one line here.
var exporterFactories = []exporter.Factory{
	kafkaexporter.NewFactory(),
	blackholeexporter.NewFactory(),
}

// Exporter selects the exporter (YAML exporter.type) and holds every
// exporter's section (exporter.<type>), each decoded by its factory.
type Exporter struct {
	Type string `yaml:"type"`
	cfgs map[string]exporter.Config
}

// Config is one exporter's configuration, as its factory's NewConfig made
// it and the file and defaults filled it (nil: no such exporter).
func (e *Exporter) Config(typ string) exporter.Config { return e.cfgs[typ] }

// Factory is the factory of the selected exporter (nil: unknown type).
func (e *Exporter) Factory() exporter.Factory { return exporterFactory(e.Type) }

// Limits are the selected exporter's (zero for an unknown type).
func (e *Exporter) Limits() exporter.Limits {
	if c := e.Config(e.Type); c != nil {
		return c.Limits()
	}
	return exporter.Limits{}
}

// UnmarshalYAML decodes type and each exporter's section, over what is
// already there (the defaults).
func (e *Exporter) UnmarshalYAML(n *yaml.Node) error {
	if e.cfgs == nil {
		e.cfgs = map[string]exporter.Config{}
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: exporter must be a mapping", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := n.Content[i].Value
		if key == "type" {
			if err := n.Content[i+1].Decode(&e.Type); err != nil {
				return err
			}
			continue
		}
		f := exporterFactory(key)
		if f == nil {
			return fmt.Errorf("line %d: unknown exporter %q (known: %s)", n.Content[i].Line, key, strings.Join(exporterTypes(), ", "))
		}
		cfg := e.cfgs[key]
		if cfg == nil {
			cfg = f.NewConfig()
			e.cfgs[key] = cfg
		}
		if err := n.Content[i+1].Decode(cfg); err != nil {
			return err
		}
	}
	// Every exporter has a configuration, those without a section (or
	// without settings, as the blackhole) their factory's zero one.
	for _, f := range exporterFactories {
		if e.cfgs[f.Type()] == nil {
			e.cfgs[f.Type()] = f.NewConfig()
		}
	}
	return nil
}

// each calls fn for every exporter section present, in the factories'
// order.
func (e *Exporter) each(fn func(f exporter.Factory, cfg exporter.Config)) {
	for _, f := range exporterFactories {
		if c := e.cfgs[f.Type()]; c != nil {
			fn(f, c)
		}
	}
}

func exporterFactory(typ string) exporter.Factory {
	for _, f := range exporterFactories {
		if f.Type() == typ {
			return f
		}
	}
	return nil
}

func exporterTypes() []string {
	var out []string
	for _, f := range exporterFactories {
		out = append(out, f.Type())
	}
	sort.Strings(out)
	return out
}

// exporterKeyTypes is the Go type of every key under exporter:, for the
// unknown-key check.
func exporterKeyTypes() map[string]reflect.Type {
	out := map[string]reflect.Type{"type": reflect.TypeOf("")}
	for _, f := range exporterFactories {
		out[f.Type()] = reflect.TypeOf(f.NewConfig())
	}
	return out
}
