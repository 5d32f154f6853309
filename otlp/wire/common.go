package wire

import (
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// ValueKind is the kind of an AnyValue.
type ValueKind uint8

// AnyValue kinds.
const (
	KindEmpty ValueKind = iota
	KindString
	KindBool
	KindInt
	KindDouble
	KindArray
	KindKVList
	KindBytes
)

// Value is a view of an OTLP AnyValue.
type Value struct {
	Kind ValueKind
	Str  []byte // string or bytes
	Int  int64
	Dbl  float64
	Bool bool
	Raw  []byte // ArrayValue or KeyValueList message (iterate with Array/KVList)
}

// Array iterates the values of an array value.
func (v Value) Array() Repeated { return Repeated{msg: v.Raw, num: 1} }

// KVList iterates the key-values of a kvlist value.
func (v Value) KVList() Repeated { return Repeated{msg: v.Raw, num: 1} }

// maxDepth bounds nesting of arrays and kvlists so a hostile payload cannot
// exhaust the stack.
const maxDepth = 32

// DecodeValue decodes an AnyValue message, validating nested values.
func DecodeValue(b []byte) (Value, error) { return decodeValue(b, 0) }

func decodeValue(b []byte, depth int) (v Value, err error) {
	if depth > maxDepth {
		return v, errAt("value", "nested too deeply")
	}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return v, errAt("value", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1:
			if err := wantType("value.string_value", f, protowire.BytesType); err != nil {
				return v, err
			}
			v = Value{Kind: KindString, Str: f.b}
		case 2:
			if err := wantType("value.bool_value", f, protowire.VarintType); err != nil {
				return v, err
			}
			v = Value{Kind: KindBool, Bool: f.u != 0}
		case 3:
			if err := wantType("value.int_value", f, protowire.VarintType); err != nil {
				return v, err
			}
			v = Value{Kind: KindInt, Int: int64(f.u)}
		case 4:
			if err := wantType("value.double_value", f, protowire.Fixed64Type); err != nil {
				return v, err
			}
			v = Value{Kind: KindDouble, Dbl: f64(f.u)}
		case 5:
			if err := wantType("value.array_value", f, protowire.BytesType); err != nil {
				return v, err
			}
			if err := walkRepeated(f.b, 1, func(e []byte) error { _, err := decodeValue(e, depth+1); return err }); err != nil {
				return v, err
			}
			v = Value{Kind: KindArray, Raw: f.b}
		case 6:
			if err := wantType("value.kvlist_value", f, protowire.BytesType); err != nil {
				return v, err
			}
			if err := walkRepeated(f.b, 1, func(e []byte) error { _, _, err := decodeKV(e, depth+1); return err }); err != nil {
				return v, err
			}
			v = Value{Kind: KindKVList, Raw: f.b}
		case 7:
			if err := wantType("value.bytes_value", f, protowire.BytesType); err != nil {
				return v, err
			}
			v = Value{Kind: KindBytes, Str: f.b}
		}
	}
	return v, nil
}

// validKV checks a KeyValue. Most attributes are a string key and a
// string value (pdata writes the value first); that shape is checked byte by
// byte here, anything else by the general decoder.
func validKV(b []byte) error {
	rest := b
	for i := 0; i < 2 && len(rest) > 0; i++ {
		tag := rest[0]
		v, n := lenField(rest[1:])
		if n < 0 || (tag != 0x0a && tag != 0x12) {
			break
		}
		if tag == 0x12 && len(v) > 0 { // value: only a whole string_value is fast
			if v[0] != 0x0a {
				break
			}
			if _, k := lenField(v[1:]); k < 0 || 1+k != len(v) {
				break
			}
		}
		rest = rest[1+n:]
	}
	if len(rest) == 0 {
		return nil
	}
	_, _, err := decodeKV(b, 0)
	return err
}

// DecodeKV decodes a KeyValue message.
func DecodeKV(b []byte) (key []byte, v Value, err error) { return decodeKV(b, 0) }

func decodeKV(b []byte, depth int) (key []byte, v Value, err error) {
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return nil, v, errAt("attribute", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1:
			if err := wantType("attribute.key", f, protowire.BytesType); err != nil {
				return nil, v, err
			}
			key = f.b
		case 2:
			if err := wantType("attribute.value", f, protowire.BytesType); err != nil {
				return nil, v, err
			}
			if v, err = decodeValue(f.b, depth); err != nil {
				return nil, v, err
			}
		}
	}
	return key, v, nil
}

// walkRepeated calls fn for every occurrence of field num (which must be
// length-delimited) in msg, checking the framing of every field.
func walkRepeated(msg []byte, num protowire.Number, fn func([]byte) error) error {
	c := cursor{rest: msg}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt("message", errTruncated.Error())
		}
		f := &c
		if f.num == num {
			if f.typ != protowire.BytesType {
				return errAt("message", "repeated field has the wrong wire type")
			}
			if err := fn(f.b); err != nil {
				return err
			}
		}
	}
	return nil
}

// Attrs iterates KeyValue attributes (already validated by the walk).
type Attrs struct{ Repeated }

// Next returns the next attribute.
func (a *Attrs) Next() (key []byte, v Value, ok bool) {
	raw, ok := a.Repeated.Next()
	if !ok {
		return nil, v, false
	}
	key, v, _ = DecodeKV(raw)
	return key, v, true
}

func validateAttrs(path string, msg []byte, num protowire.Number) error {
	return walkRepeated(msg, num, func(kv []byte) error {
		if err := validKV(kv); err != nil {
			return errAt(path, err.Error())
		}
		return nil
	})
}

// Resource is a view of an OTLP Resource.
type Resource struct {
	Raw       []byte // the Resource message
	SchemaURL []byte
}

// Attributes iterates the resource's attributes.
func (r *Resource) Attributes() Attrs { return Attrs{Repeated{msg: r.Raw, num: 1}} }

// Scope is a view of an InstrumentationScope.
type Scope struct {
	Raw       []byte
	Name      []byte
	Version   []byte
	SchemaURL []byte
}

// Attributes iterates the scope's attributes.
func (s *Scope) Attributes() Attrs { return Attrs{Repeated{msg: s.Raw, num: 3}} }

func decodeResource(b []byte) (Resource, error) {
	if err := validateAttrs("resource.attributes", b, 1); err != nil {
		return Resource{}, err
	}
	return Resource{Raw: b}, nil
}

func decodeScope(b []byte) (Scope, error) {
	s := Scope{Raw: b}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return s, errAt("scope", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1:
			if err := wantType("scope.name", f, protowire.BytesType); err != nil {
				return s, err
			}
			s.Name = f.b
		case 2:
			if err := wantType("scope.version", f, protowire.BytesType); err != nil {
				return s, err
			}
			s.Version = f.b
		case 3:
			if err := wantType("scope.attributes", f, protowire.BytesType); err != nil {
				return s, err
			}
			if err := validKV(f.b); err != nil {
				return s, errAt("scope.attributes", err.Error())
			}
		}
	}
	return s, nil
}

// signalPaths are the error paths of one signal, built once so that the
// walk never concatenates strings on its hot path.
type signalPaths struct {
	resource, resResource, resScopes, resSchema string
	scope, scScope, scItems, scSchema           string
}

func newPaths(kind string) signalPaths {
	return signalPaths{
		resource: "resource_" + kind, resResource: "resource_" + kind + ".resource",
		resScopes: "resource_" + kind + ".scope_" + kind, resSchema: "resource_" + kind + ".schema_url",
		scope: "scope_" + kind, scScope: "scope_" + kind + ".scope",
		scItems: "scope_" + kind + "." + kind, scSchema: "scope_" + kind + ".schema_url",
	}
}

var (
	spansPaths   = newPaths("spans")
	logsPaths    = newPaths("logs")
	metricsPaths = newPaths("metrics")
)

// walker is the shared outer loop of all three signals, as a pull
// iterator so that it and the views it hands out live on the caller's stack:
//
//	Data{ repeated Resource<X>(1){ resource(1), scope_<x>(2), schema_url(3) } }
//	Scope<X>{ scope(1), items(2), schema_url(3) }
//
// Each resource and scope message is checked field by field when entered
// (its resource or scope may come after its items on the wire), then its
// items are handed out in order.
type walker struct {
	p      *signalPaths
	top    cursor
	res    Resource
	scopes Repeated
	sc     Scope
	items  Repeated
	err    error
}

func newWalker(data []byte, p *signalPaths) walker {
	return walker{p: p, top: cursor{rest: data}}
}

// nextItem returns the next item's bytes; false at the end or on error.
func (w *walker) nextItem() ([]byte, bool) {
	for w.err == nil {
		if item, ok := w.items.Next(); ok {
			return item, true
		}
		if sb, ok := w.scopes.Next(); ok {
			w.err = w.enterScope(sb)
			continue
		}
		if len(w.top.rest) == 0 {
			return nil, false
		}
		if !w.top.next() {
			w.err = errAt(w.p.resource, errTruncated.Error())
			break
		}
		if w.top.num != 1 {
			continue
		}
		if w.top.typ != protowire.BytesType {
			w.err = typeErr(w.p.resource, &w.top, protowire.BytesType)
			break
		}
		w.err = w.enterResource(w.top.b)
	}
	return nil, false
}

func (w *walker) enterResource(rb []byte) error {
	p := w.p
	w.res = Resource{}
	c := cursor{rest: rb}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt(p.resource, errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1:
			if err := wantType(p.resResource, f, protowire.BytesType); err != nil {
				return err
			}
			r, err := decodeResource(f.b)
			if err != nil {
				return err
			}
			r.SchemaURL = w.res.SchemaURL
			w.res = r
		case 2:
			if err := wantType(p.resScopes, f, protowire.BytesType); err != nil {
				return err
			}
		case 3:
			if err := wantType(p.resSchema, f, protowire.BytesType); err != nil {
				return err
			}
			w.res.SchemaURL = f.b
		}
	}
	w.scopes = Repeated{msg: rb, num: 2}
	w.items = Repeated{}
	return nil
}

func (w *walker) enterScope(sb []byte) error {
	p := w.p
	w.sc = Scope{}
	c := cursor{rest: sb}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt(p.scope, errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1:
			if err := wantType(p.scScope, f, protowire.BytesType); err != nil {
				return err
			}
			d, err := decodeScope(f.b)
			if err != nil {
				return err
			}
			d.SchemaURL = w.sc.SchemaURL
			w.sc = d
		case 2:
			if err := wantType(p.scItems, f, protowire.BytesType); err != nil {
				return err
			}
		case 3:
			if err := wantType(p.scSchema, f, protowire.BytesType); err != nil {
				return err
			}
			w.sc.SchemaURL = f.b
		}
	}
	w.items = Repeated{msg: sb, num: 2}
	return nil
}

// ResourceAttribute returns the string values of attribute key on every
// resource of a TracesData / MetricsData / LogsData (the field layout of the
// outer message is the same for all three), and how many attributes of
// that key there are of any type, reading nothing below the resources.
func ResourceAttribute(data []byte, key string) (strs []string, all int, err error) {
	err = walkRepeated(data, 1, func(rb []byte) error {
		return walkRepeated(rb, 1, func(res []byte) error {
			a := Attrs{Repeated{msg: res, num: 1}}
			for {
				k, v, ok := a.Next()
				if !ok {
					return nil
				}
				if string(k) != key {
					continue
				}
				all++
				if v.Kind == KindString {
					strs = append(strs, string(v.Str))
				}
			}
		})
	})
	return strs, all, err
}

// FirstResource returns the first Resource message of a TracesData /
// MetricsData / LogsData (nil if none), reading nothing else.
func FirstResource(data []byte) []byte {
	var out []byte
	_ = walkRepeated(data, 1, func(rb []byte) error {
		if out != nil {
			return nil
		}
		return walkRepeated(rb, 1, func(res []byte) error {
			if out == nil {
				out = res
			}
			return nil
		})
	})
	return out
}

// LookupAttr returns the string form of attribute key in a Resource message.
func LookupAttr(resource []byte, key string) (string, bool) {
	a := Attrs{Repeated{msg: resource, num: 1}}
	for {
		k, v, ok := a.Next()
		if !ok {
			return "", false
		}
		if string(k) != key {
			continue
		}
		switch v.Kind {
		case KindString:
			return string(v.Str), true
		case KindInt:
			return strconv.FormatInt(v.Int, 10), true
		case KindBool:
			return strconv.FormatBool(v.Bool), true
		case KindDouble:
			return strconv.FormatFloat(v.Dbl, 'g', -1, 64), true
		}
		return "", true
	}
}
