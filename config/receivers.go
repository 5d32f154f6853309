package config

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/filereceiver"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
	"github.com/ferryhq/ferry/receiver/kafkafront"
	"github.com/ferryhq/ferry/receiver/localreceiver"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/receiver/syslogreceiver"
)

// receiverFactories are the receivers ferry is built with, in the order
// their sections appear in `ferry config default` and their listeners
// start. Adding a receiver is its package and one line here.
var receiverFactories = []receiver.Factory{
	httpreceiver.NewFactory(),
	otlpreceiver.NewFactory(),
	localreceiver.NewFactory(),
	kafkafront.NewFactory(),
	filereceiver.NewFactory(),
	syslogreceiver.NewFactory(),
}

// The receivers whose configuration names topics in full say so (the
// exporter creates those topics); the others' clients choose theirs.
var (
	_ receiver.FixedTopics = (*otlpreceiver.Config)(nil)
	_ receiver.FixedTopics = (*filereceiver.Config)(nil)
	_ receiver.FixedTopics = (*syslogreceiver.Config)(nil)
)

// Receivers is every receiver's section (YAML receivers.<type>), each
// decoded by its factory into its own Config.
type Receivers struct {
	cfgs map[string]receiver.Config
}

// ReceiverConfig is one receiver's configuration, as its factory's
// NewConfig made it (nil: no such receiver).
func (r *Receivers) ReceiverConfig(typ string) receiver.Config { return r.cfgs[typ] }

// Each calls fn for every receiver, in the factories' order.
func (r *Receivers) Each(fn func(f receiver.Factory, cfg receiver.Config)) {
	for _, f := range receiverFactories {
		fn(f, r.cfgs[f.Type()])
	}
}

// UnmarshalYAML decodes each section into its receiver's configuration,
// over what is already there (the defaults).
func (r *Receivers) UnmarshalYAML(n *yaml.Node) error {
	if r.cfgs == nil {
		r.cfgs = map[string]receiver.Config{}
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: receivers must be a mapping of receiver names", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		typ := n.Content[i].Value
		f := receiverFactory(typ)
		if f == nil {
			return fmt.Errorf("line %d: unknown receiver %q (known: %s)", n.Content[i].Line, typ, strings.Join(receiverTypes(), ", "))
		}
		cfg := r.cfgs[typ]
		if cfg == nil {
			cfg = f.NewConfig()
			r.cfgs[typ] = cfg
		}
		if err := n.Content[i+1].Decode(cfg); err != nil {
			return err
		}
	}
	return nil
}

func receiverFactory(typ string) receiver.Factory {
	for _, f := range receiverFactories {
		if f.Type() == typ {
			return f
		}
	}
	return nil
}

func receiverTypes() []string {
	var out []string
	for _, f := range receiverFactories {
		out = append(out, f.Type())
	}
	sort.Strings(out)
	return out
}

// receiverKeyTypes is the Go type of every receiver's section, for the
// unknown-key check.
func receiverKeyTypes() map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for _, f := range receiverFactories {
		out[f.Type()] = reflect.TypeOf(f.NewConfig())
	}
	return out
}

// assembleDefaults puts every receiver's and every exporter's default
// section, in the factories' order, at their marker lines in default.yaml.
func assembleDefaults(top []byte) []byte {
	var rs, es [][]byte
	for _, f := range receiverFactories {
		rs = append(rs, bytes.TrimRight(f.DefaultYAML(), "\n"))
	}
	for _, f := range exporterFactories {
		if d := f.DefaultYAML(); d != nil {
			es = append(es, bytes.TrimRight(d, "\n"))
		}
	}
	return atMarker(atMarker(top, "  #@receivers:", rs), "  #@exporters:", es)
}

// atMarker replaces the line that starts with marker by sections.
func atMarker(top []byte, marker string, sections [][]byte) []byte {
	lines := bytes.Split(top, []byte("\n"))
	for i, l := range lines {
		if bytes.HasPrefix(l, []byte(marker)) {
			lines[i] = bytes.Join(sections, []byte("\n\n"))
			return bytes.Join(lines, []byte("\n"))
		}
	}
	panic("config: default.yaml has no " + marker + " line")
}
