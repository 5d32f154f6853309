// Package config owns ferry's user configuration: the YAML file, its
// defaults, ${ENV} expansion, --set overrides and validation.
//
// The defaults are the embedded default.yaml, the same text that
// `ferry config default` prints, so the documented defaults and the real ones
// cannot drift apart. A user file is decoded over those defaults with unknown
// keys rejected, then every component validates its own section; errors name
// the full key path (for example exporter.kafka.compression).
package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/bytesize"
)

//go:embed default.yaml
var topYAML []byte

// defaultYAML is default.yaml with every receiver's and exporter's own
// default section in its place.
var defaultYAML = assembleDefaults(topYAML)

// DefaultYAML returns the commented default configuration.
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// Default returns the built-in configuration.
func Default() *Config {
	c := &Config{}
	if err := decodeStrict(defaultYAML, c); err != nil {
		panic("config: embedded default.yaml is invalid: " + err.Error())
	}
	return c
}

// Load reads the file at path (none when path is ""), applies the --set
// overrides ("a.b.c=value", value in YAML syntax) and validates the result.
func Load(path string, sets []string) (*Config, error) {
	var raw []byte
	if path != "" {
		var err error
		if raw, err = ReadFile(path); err != nil {
			return nil, err
		}
	}
	return LoadSource(path, raw, sets)
}

// ReadFile reads the configuration file at path as written (${ENV} not
// yet expanded).
func ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

// LoadSource is Load on the bytes of the file at path, already read. A
// file that holds no setting once expanded (empty, only comments, {} or a
// ${VAR} that is empty: an unreadable pipe or a mistyped process
// substitution reads as that) is an error: a named file is never silently
// replaced by the defaults, which may run with authentication off.
func LoadSource(path string, raw []byte, sets []string) (*Config, error) {
	var src []byte
	if path != "" {
		var err error
		if src, err = ExpandEnv(raw, os.LookupEnv); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(src, &doc); err == nil && (doc.Kind == 0 || len(doc.Content) == 0 || len(doc.Content[0].Content) == 0) {
			return nil, fmt.Errorf("%s: the file holds no settings (to run on the built-in defaults, leave out -c)", path)
		}
	}
	return Parse(src, sets)
}

// Parse is Load on bytes already read and expanded.
func Parse(src []byte, sets []string) (*Config, error) {
	var doc yaml.Node
	if len(bytes.TrimSpace(src)) > 0 {
		if err := yaml.Unmarshal(src, &doc); err != nil {
			return nil, err
		}
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, errors.New("config: the top level must be a mapping of keys")
	}
	for _, s := range sets {
		if err := applySet(root, s); err != nil {
			return nil, err
		}
	}
	if err := checkKeys(root, reflect.TypeOf(Config{}), ""); err != nil {
		return nil, err
	}
	merged, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, err
	}
	c := Default()
	if err := decodeStrict(merged, c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func decodeStrict(b []byte, out any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("config: %s", strings.ReplaceAll(err.Error(), "yaml: unmarshal errors:\n  ", ""))
	}
	return nil
}

// applySet sets a dotted key path in a YAML mapping, creating mappings on the
// way. The value is parsed as YAML, so lists ("[a,b]") and numbers work.
func applySet(root *yaml.Node, set string) error {
	path, value, ok := strings.Cut(set, "=")
	if !ok || path == "" {
		return fmt.Errorf("--set %q: want key.path=value", set)
	}
	var val yaml.Node
	if err := yaml.Unmarshal([]byte(value), &val); err != nil {
		return fmt.Errorf("--set %s: %w", path, err)
	}
	var v *yaml.Node
	if val.Kind == yaml.DocumentNode && len(val.Content) == 1 {
		v = val.Content[0]
		v.Line = 0 // errors about it should not cite a line of a file
	} else {
		v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
	}
	node := root
	keys := strings.Split(path, ".")
	for i, k := range keys {
		var next *yaml.Node
		for j := 0; j+1 < len(node.Content); j += 2 {
			if node.Content[j].Value == k {
				next = node.Content[j+1]
				if i == len(keys)-1 {
					node.Content[j+1] = v
					return nil
				}
				break
			}
		}
		if i == len(keys)-1 {
			node.Content = append(node.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, v)
			return nil
		}
		if next == nil {
			next = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			node.Content = append(node.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, next)
		}
		if next.Kind != yaml.MappingNode {
			return fmt.Errorf("--set %s: %s is not a mapping", path, strings.Join(keys[:i+1], "."))
		}
		node = next
	}
	return nil
}

var envRef = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)

// ExpandEnv replaces ${NAME} and ${NAME:-default} in a config file; "$$" is a
// literal "$". A lone "$" is left alone, so secrets containing "$" survive,
// and comments are left alone, so documentation may mention ${NAME}. An unset
// variable without a default is an error naming it and its line, since
// silently using "" for a broker address or key is worse than not starting.
func ExpandEnv(src []byte, lookup func(string) (string, bool)) ([]byte, error) {
	var out bytes.Buffer
	for i, line := range bytes.SplitAfter(src, []byte("\n")) {
		code, comment := splitComment(line)
		var firstErr error
		code = envRef.ReplaceAllFunc(code, func(m []byte) []byte {
			if string(m) == "$$" {
				return []byte("$")
			}
			sub := envRef.FindSubmatch(m)
			name := string(sub[1])
			if v, ok := lookup(name); ok {
				return []byte(v)
			}
			if len(sub[2]) > 0 {
				return sub[3]
			}
			if firstErr == nil {
				firstErr = fmt.Errorf("line %d: environment variable %s is not set (use ${%s:-default} to allow that)", i+1, name, name)
			}
			return nil
		})
		if firstErr != nil {
			return nil, firstErr
		}
		out.Write(code)
		out.Write(comment)
	}
	return out.Bytes(), nil
}

// splitComment cuts a YAML line before its comment: a "#" at the start or
// after white space, outside quotes.
func splitComment(line []byte) (code, comment []byte) {
	var quote byte
	for i, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i], line[i:]
		}
	}
	return line, nil
}

// checkKeys walks a mapping against the struct it decodes into and names the
// first unknown key by its full path, which yaml's own error does not.
func checkKeys(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	// Scalars whose parse errors would otherwise not say which key they are.
	if n.Kind == yaml.ScalarNode {
		var err error
		switch t {
		case reflect.TypeOf(bytesize.Size(0)):
			_, err = bytesize.Parse(n.Value)
		case reflect.TypeOf(time.Duration(0)):
			_, err = time.ParseDuration(n.Value)
		}
		if err != nil {
			return fmt.Errorf("config: %s%s: %v", where(n), path, err)
		}
		return nil
	}
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return nil
	}
	fields := map[string]reflect.Type{}
	switch t {
	case reflect.TypeOf(Receivers{}):
		// Each receiver's section is its factory's Config.
		fields = receiverKeyTypes()
	case reflect.TypeOf(Exporter{}):
		fields = exporterKeyTypes()
	default:
		yamlFields(t, fields)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		ft, ok := fields[k]
		full := k
		if path != "" {
			full = path + "." + k
		}
		if !ok {
			known := make([]string, 0, len(fields))
			for name := range fields {
				known = append(known, name)
			}
			sort.Strings(known)
			return fmt.Errorf("config: %sunknown key %s (known here: %s)", where(n.Content[i]), full, strings.Join(known, ", "))
		}
		if err := checkKeys(n.Content[i+1], ft, full); err != nil {
			return err
		}
	}
	return nil
}

// yamlFields adds t's YAML keys to fields, those of inline structs
// included.
func yamlFields(t reflect.Type, fields map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" && f.Type.Kind() == reflect.Struct {
			yamlFields(f.Type, fields)
			continue
		}
		if name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
}

func where(n *yaml.Node) string {
	if n.Line == 0 {
		return "" // from --set
	}
	return fmt.Sprintf("line %d: ", n.Line)
}
