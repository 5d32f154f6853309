package prom

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

// RemoteWriteAmplify bounds the OTLP bytes per (decoded) body byte, the
// reservation made before conversion (at most max_request_bytes). Measured
// (TestAmplification, docs/prometheus.md): one sample a series, as
// Prometheus sends, is 1.2-2.5× (v1 tiny series, label floods, v2 from a
// shared symbol table); a series of many samples repeats its labels in
// every OTLP point (20 labels × 2000 samples: 31×); a v2 request that
// references one long symbol from every series (54×) is refused (413).
const RemoteWriteAmplify = 32

// RemoteWrite converts a remote write request (v1 prometheus.WriteRequest,
// or v2 io.prometheus.write.v2.Request by its Content-Type), already
// snappy-decoded, into an OTLP ExportMetricsServiceRequest appended to dst,
// within lim (otlp/door).
func RemoteWrite(q *http.Request, body, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
	v2 := false
	if ct := q.Header.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/x-protobuf" {
			return nil, fmt.Errorf("content type %q: remote write is application/x-protobuf", ct)
		}
		switch params["proto"] {
		case "", "prometheus.WriteRequest":
		case "io.prometheus.write.v2.Request":
			v2 = true
		default:
			return nil, fmt.Errorf("content type %q: proto %q is not served (prometheus.WriteRequest, io.prometheus.write.v2.Request)", ct, params["proto"])
		}
	}
	return convertRW(body, dst, lim, st, v2, "prometheus_remote_write")
}

func convertRW(body, dst []byte, lim door.Limits, st *door.Stats, v2 bool, doorName string) ([]byte, error) {
	max := lim.MaxBytes
	if len(body) >= math.MaxUint32 {
		return nil, ErrTooLarge
	}
	c := &conv{src: body, door: doorName, lim: lim, st: st, w: pbw{b: dst, max: max}}
	var err error
	if v2 {
		err = c.decodeV2(max)
	} else {
		err = c.decodeV1(max)
	}
	if err != nil {
		return nil, err
	}
	c.group()
	c.points = 0 // counted again, exactly, as written
	err = c.emit(c.rwSamples(v2), c.rwHists(v2))
	if err != nil {
		return nil, err
	}
	return c.w.b, nil
}

var errTrunc = errors.New("truncated protobuf")

// onSymbolCheck, set by a test, is called each time a v2 label's symbols
// are checked (checkLabel), which must be once a symbol pair, not once a
// reference.
var onSymbolCheck func()

// fields walks the fields of msg: fn gets each field's number, wire type,
// the varint or fixed value, and the bytes of a length-delimited one.
func fields(msg []byte, fn func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error) error {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return errTrunc
		}
		msg = msg[n:]
		var v uint64
		var b []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(msg)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(msg)
		case protowire.Fixed32Type:
			var v32 uint32
			v32, n = protowire.ConsumeFixed32(msg)
			v = uint64(v32)
		case protowire.BytesType:
			b, n = protowire.ConsumeBytes(msg)
		default:
			n = protowire.ConsumeFieldValue(num, typ, msg)
		}
		if n < 0 {
			return errTrunc
		}
		msg = msg[n:]
		if err := fn(num, typ, v, b); err != nil {
			return err
		}
	}
	return nil
}

// maxInterleaved bounds the other fields (samples …) a series may have
// among its labels: its points' attributes are read from the stretch of its
// message that holds its labels, once a point, so that stretch must not
// hold its samples.
const maxInterleaved = 16

// maxLabelFields bounds the fields of a v1 Label message (name and value;
// a sender may repeat them, protobuf keeping the last), walked again for
// every point of its series.
const maxLabelFields = 16

// labelRegion is the stretch of a series message (v1 TimeSeries, v2
// TimeSeries: labels or their references are field 1) from its first
// label field to the end of its last.
func labelRegion(msg []byte) (span []byte, err error) {
	lo, hi, others, pending := -1, -1, 0, 0
	for i := 0; i < len(msg); {
		num, typ, n := protowire.ConsumeTag(msg[i:])
		if n < 0 {
			return nil, errTrunc
		}
		m := protowire.ConsumeFieldValue(num, typ, msg[i+n:])
		if m < 0 {
			return nil, errTrunc
		}
		if num == 1 {
			if lo < 0 {
				lo = i
			}
			hi, others, pending = i+n+m, others+pending, 0
		} else if lo >= 0 {
			pending++
			if typ == protowire.StartGroupType {
				// a group is one field however many it nests, and each
				// point's walk of the region would parse them all
				pending += maxInterleaved
			}
		}
		i += n + m
	}
	if others > maxInterleaved {
		return nil, fmt.Errorf("a series whose labels are interleaved with %d other fields (at most %d)", others, maxInterleaved)
	}
	if lo < 0 {
		return nil, nil
	}
	return msg[lo:hi], nil
}

func (c *conv) spanOf(b []byte) span {
	if len(b) == 0 {
		return span{}
	}
	return span{uint32(cap(c.src) - cap(b)), uint32(len(b))}
}

type meta struct {
	kind       kind
	help, unit span
}

// checkLabel applies the label bounds.
func checkLabel(name, value []byte) error {
	if len(name) == 0 {
		return errors.New("a label with an empty name")
	}
	if len(name) > MaxLabelNameBytes {
		return fmt.Errorf("a label name of %d bytes (at most %d)", len(name), MaxLabelNameBytes)
	}
	if len(value) > MaxLabelValueBytes {
		return fmt.Errorf("label %.64q: a value of %d bytes (at most %d)", name, len(value), MaxLabelValueBytes)
	}
	if !utf8.Valid(name) || !utf8.Valid(value) {
		return fmt.Errorf("label %.64q: not UTF-8", name)
	}
	return nil
}

// counts checks the request's shape against the bounds before anything
// is allocated.
func checkCounts(nSeries, nPoints, max int) error {
	if nSeries > MaxSeriesPerRequest {
		return fmt.Errorf("%w: %d series (at most %d a request)", ErrTooLarge, nSeries, MaxSeriesPerRequest)
	}
	if nPoints > max/minPointBytes {
		return fmt.Errorf("%w: %d points cannot fit %d bytes", ErrTooLarge, nPoints, max)
	}
	return nil
}

func (c *conv) addLabel(s *series, name, value []byte) error {
	if err := checkLabel(name, value); err != nil {
		return err
	}
	return c.addChecked(s, name, value)
}

// addChecked is addLabel for a label checkLabel passed.
func (c *conv) addChecked(s *series, name, value []byte) error {
	if int(s.nLabels) >= MaxLabelsPerSeries {
		return fmt.Errorf("a series with more than %d labels", MaxLabelsPerSeries)
	}
	switch string(name) {
	case "__name__":
		s.name = c.spanOf(value)
		return nil
	case "job":
		s.job, s.hasJob = c.spanOf(value), true
		return nil
	case "instance":
		s.inst, s.hasInst = c.spanOf(value), true
		return nil
	}
	if len(value) == 0 {
		return nil // an empty label is no label, in Prometheus
	}
	switch string(name) {
	case "le":
		s.le = true
	case "quantile":
		s.quant = true
	}
	s.nLabels++
	return nil
}

// eachLabel calls fn with each label of s kept by addLabel, walking its
// labels again (v1 Label messages, v2 references into the symbols): the
// stretch of its message that holds them (labelRegion), not its samples,
// so that a point's attributes cost its labels, not its series.
func (c *conv) eachLabel(s *series, fn func(name, value []byte)) {
	keep := func(name, value []byte) {
		if len(value) == 0 {
			return
		}
		switch string(name) {
		case "__name__", "job", "instance":
			return
		}
		fn(name, value)
	}
	if !c.v2 {
		_ = fields(s.lab.of(c.src), func(num protowire.Number, typ protowire.Type, _ uint64, lb []byte) error {
			if num != 1 || typ != protowire.BytesType {
				return nil
			}
			var name, value []byte
			_ = fields(lb, func(num protowire.Number, _ protowire.Type, _ uint64, b []byte) error {
				switch num {
				case 1:
					name = b
				case 2:
					value = b
				}
				return nil
			})
			keep(name, value)
			return nil
		})
		return
	}
	c.eachRef(s, func(nr, vr int32) { fn(c.str(c.syms[nr]), c.str(c.syms[vr])) })
}

// eachRef is v2's eachLabel by symbol indices: fn gets each kept label's
// name and value symbols.
func (c *conv) eachRef(s *series, fn func(nr, vr int32)) {
	var pend int32
	half := false
	ref := func(r uint64) {
		if r >= uint64(len(c.syms)) {
			return // decodeV2 refused it
		}
		if !half {
			pend, half = int32(r), true
			return
		}
		half = false
		if c.syms[r].n == 0 {
			return
		}
		switch string(c.str(c.syms[pend])) {
		case "__name__", "job", "instance":
			return
		}
		fn(pend, int32(r))
	}
	_ = fields(s.lab.of(c.src), func(num protowire.Number, typ protowire.Type, v uint64, fb []byte) error {
		if num != 1 {
			return nil
		}
		if typ == protowire.VarintType {
			ref(v)
			return nil
		}
		for len(fb) > 0 {
			r, n := protowire.ConsumeVarint(fb)
			if n < 0 {
				return errTrunc
			}
			ref(r)
			fb = fb[n:]
		}
		return nil
	})
}

// decodeV1 reads a prometheus.WriteRequest: timeseries (1), metadata (3).
func (c *conv) decodeV1(max int) error {
	nSeries, nPoints, nMeta := 0, 0, 0
	err := fields(c.src, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			nSeries++
			nl := 0
			err := fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, _ []byte) error {
				switch num {
				case 1:
					nl++
					if nl > MaxLabelsPerSeries {
						return fmt.Errorf("a series with more than %d labels", MaxLabelsPerSeries)
					}
				case 2, 4:
					nPoints++
				}
				return nil
			})
			return err
		case num == 3 && typ == protowire.BytesType:
			nMeta++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := checkCounts(nSeries, nPoints, max); err != nil {
		return err
	}
	if nMeta > MaxSeriesPerRequest {
		return fmt.Errorf("%w: %d metadata entries in one request, at most %d", ErrTooLarge, nMeta, MaxSeriesPerRequest)
	}
	var metas map[string]meta
	if nMeta > 0 {
		// Grown as entries are read: empty entries (two bytes each) must
		// not size a map for millions.
		metas = make(map[string]meta, min(nMeta, 1024))
	}
	// metadata first: Prometheus sends it after the series, or alone.
	err = fields(c.src, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 3:
			var m meta
			var name []byte
			err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, b []byte) error {
				switch num {
				case 1:
					if v <= uint64(kStateset) {
						m.kind = kind(v)
					}
				case 2:
					name = b
				case 4:
					m.help = c.spanOf(b)
				case 5:
					m.unit = c.spanOf(b)
				}
				return nil
			})
			if err != nil {
				return err
			}
			metas[string(name)] = m
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.series = make([]series, 0, min(nSeries, seriesPrealloc))
	return fields(c.src, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			s := series{msg: c.spanOf(b)}
			lab, err := labelRegion(b)
			if err != nil {
				return err
			}
			s.lab = c.spanOf(lab)
			err = fields(b, func(num protowire.Number, typ protowire.Type, v uint64, lb []byte) error {
				switch num {
				case 1:
					var name, value []byte
					nf := 0
					if err := fields(lb, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
						// each point's attributes walk this message again
						// (eachLabel): it must cost its name and value
						if nf++; nf > maxLabelFields || typ == protowire.StartGroupType {
							return fmt.Errorf("a label of more than %d fields, or of a group", maxLabelFields)
						}
						switch num {
						case 1:
							name = b
						case 2:
							value = b
						}
						return nil
					}); err != nil {
						return err
					}
					return c.addLabel(&s, name, value)
				}
				if typ != protowire.BytesType {
					return nil // not a message: what rwSamples and rwHists skip
				}
				switch num {
				case 2:
					s.nSamples++
				case 3:
					c.st.Drop(door.Exemplar, 1)
				case 4:
					s.nHists++
					if !s.nhcb {
						s.nhcb = schemaOf(lb) == -53
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			if s.name.n == 0 {
				return errors.New("a series without __name__")
			}
			if metas != nil {
				m, ok := lookupMeta(metas, c.str(s.name))
				if ok {
					s.kind, s.help, s.unit = m.kind, m.help, m.unit
				}
			}
			return c.keep(s)
		}
		return nil
	})
}

// seriesPrealloc: the series a request's decoding state is first sized
// for (Prometheus sends 2,000 a request); more grow it as read, so that a
// request refused for its items midway has not sized it for all.
const seriesPrealloc = 2048

// keep adds a decoded series, counting the samples that will each be a
// data point (a series of no histogram type, without native histograms,
// not target_info): past lim.MaxItems the request is refused now, before
// the rest is decoded.
func (c *conv) keep(s series) error {
	info := string(c.str(s.name)) == "target_info"
	if s.nSamples+s.nHists == 0 && !info {
		return nil
	}
	if s.nHists == 0 && !info && s.kind != kHistogram && s.kind != kSummary && s.kind != kGaugeHistogram {
		c.points += int(s.nSamples)
		if c.lim.Over(c.points) {
			return tooManyPoints(c.lim.MaxItems)
		}
	}
	c.series = append(c.series, s)
	return nil
}

func tooManyPoints(max int) error {
	return fmt.Errorf("%w: more than %d data points in one request", door.ErrTooManyItems, max)
}

// lookupMeta finds a series' family: its name, or its name less a type's
// suffix.
func lookupMeta(metas map[string]meta, name []byte) (meta, bool) {
	if m, ok := metas[string(name)]; ok {
		return m, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count", "_total", "_created", "_info"} {
		if bytes.HasSuffix(name, []byte(suf)) {
			if m, ok := metas[string(name[:len(name)-len(suf)])]; ok {
				return m, true
			}
		}
	}
	return meta{}, false
}

func schemaOf(h []byte) int32 {
	schema := int32(0)
	_ = fields(h, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
		if num == 4 && typ == protowire.VarintType {
			schema = int32(protowire.DecodeZigZag(v))
		}
		return nil
	})
	return schema
}

// decodeV2 reads an io.prometheus.write.v2.Request: symbols (4),
// timeseries (5) with label references into the symbols.
func (c *conv) decodeV2(max int) error {
	nSym, nSeries, nPoints := 0, 0, 0
	err := fields(c.src, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		switch {
		case num == 4 && typ == protowire.BytesType:
			nSym++
		case num == 5 && typ == protowire.BytesType:
			nSeries++
			refs := 0 // the series' label references, in all its field-1 entries
			return fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
				switch num {
				case 1:
					n := 1
					if typ == protowire.BytesType {
						n = 0
						for _, x := range b {
							if x < 0x80 {
								n++
							}
						}
					}
					refs += n
					if refs/2 > MaxLabelsPerSeries {
						return fmt.Errorf("a series with more than %d labels", MaxLabelsPerSeries)
					}
				case 2, 3:
					nPoints++
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := checkCounts(nSeries, nPoints, max); err != nil {
		return err
	}
	if nSym > MaxSymbols {
		return fmt.Errorf("%w: %d symbols (at most %d)", ErrTooLarge, nSym, MaxSymbols)
	}
	syms := make([]span, 0, nSym)
	_ = fields(c.src, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if num == 4 && typ == protowire.BytesType {
			syms = append(syms, c.spanOf(b))
		}
		return nil
	})
	c.syms, c.v2 = syms, true
	c.canonOf, c.canonIdx = make([]int32, len(syms)), make(map[string]int32)
	sym := func(r uint64) ([]byte, error) {
		if r >= uint64(len(syms)) {
			return nil, fmt.Errorf("symbol reference %d past the %d symbols", r, len(syms))
		}
		return c.str(syms[r]), nil
	}
	const asName, asValue = 1, 2
	checked := make([]uint8, len(syms)) // what checkLabel passed each symbol as
	c.series = make([]series, 0, min(nSeries, seriesPrealloc))
	return fields(c.src, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
		if num != 5 || typ != protowire.BytesType {
			return nil
		}
		s := series{msg: c.spanOf(b)}
		lab, err := labelRegion(b)
		if err != nil {
			return err
		}
		s.lab = c.spanOf(lab)
		var refs []uint64
		var buf [2 * 32]uint64
		refs = buf[:0]
		err = fields(b, func(num protowire.Number, typ protowire.Type, v uint64, fb []byte) error {
			switch num {
			case 1:
				if typ == protowire.VarintType {
					refs = append(refs, v)
					return nil
				}
				for len(fb) > 0 {
					r, n := protowire.ConsumeVarint(fb)
					if n < 0 {
						return errTrunc
					}
					refs = append(refs, r)
					fb = fb[n:]
				}
			case 2, 3, 4:
				if typ != protowire.BytesType {
					return nil // not a message: what rwSamples and rwHists skip
				}
				switch num {
				case 2:
					s.nSamples++
				case 3:
					s.nHists++
					if !s.nhcb {
						s.nhcb = schemaOf(fb) == -53
					}
				case 4:
					c.st.Drop(door.Exemplar, 1)
				}
			case 5:
				return fields(fb, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
					switch num {
					case 1:
						if v <= uint64(kStateset) {
							s.kind = kind(v)
						}
					case 3, 4:
						str, err := sym(v)
						if err != nil {
							return err
						}
						if num == 3 {
							s.help = c.spanOf(str)
						} else {
							s.unit = c.spanOf(str)
						}
					}
					return nil
				})
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(refs)%2 != 0 {
			return errors.New("a series with an odd number of label references")
		}
		for i := 0; i < len(refs); i += 2 {
			name, err := sym(refs[i])
			if err != nil {
				return err
			}
			value, err := sym(refs[i+1])
			if err != nil {
				return err
			}
			// checked once a symbol (as a name, as a value), not once a
			// reference: every series may reference the same 16 KiB
			if checked[refs[i]]&asName == 0 || checked[refs[i+1]]&asValue == 0 {
				if onSymbolCheck != nil {
					onSymbolCheck()
				}
				if err := checkLabel(name, value); err != nil {
					return err
				}
				checked[refs[i]] |= asName
				checked[refs[i+1]] |= asValue
			}
			if err := c.addChecked(&s, name, value); err != nil {
				return err
			}
			switch string(name) {
			case "__name__":
				s.nameRef = int32(refs[i+1])
			case "job":
				s.jobRef = int32(refs[i+1])
			case "instance":
				s.instRef = int32(refs[i+1])
			}
		}
		if s.name.n == 0 {
			return errors.New("a series without __name__")
		}
		return c.keep(s)
	})
}

// rwSamples walks a series' samples: v1 Sample{value 1, timestamp 2},
// v2 Sample{value 1, timestamp 2, start_timestamp 3}; v2's series-level
// created_timestamp (6, an earlier draft) is the start too.
func (c *conv) rwSamples(v2 bool) func(s *series, fn func(v float64, ts, start int64)) error {
	return func(s *series, fn func(v float64, ts, start int64)) error {
		var created int64
		if v2 {
			_ = fields(s.msg.of(c.src), func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
				if num == 6 && typ == protowire.VarintType {
					created = int64(v)
				}
				return nil
			})
		}
		return fields(s.msg.of(c.src), func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
			if num != 2 || typ != protowire.BytesType {
				return nil
			}
			var val float64
			var ts, start int64
			err := fields(b, func(num protowire.Number, typ protowire.Type, v uint64, _ []byte) error {
				switch num {
				case 1:
					if typ == protowire.Fixed64Type {
						val = math.Float64frombits(v)
					}
				case 2:
					ts = int64(v)
				case 3:
					if v2 {
						start = int64(v)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			if start == 0 {
				start = created
			}
			fn(val, ts, start)
			return c.w.err
		})
	}
}

// rwHists walks a series' native histograms (v1 field 4, v2 field 3).
func (c *conv) rwHists(v2 bool) func(s *series, fn func(h *nhist)) error {
	var h nhist
	field := protowire.Number(4)
	if v2 {
		field = 3
	}
	return func(s *series, fn func(h *nhist)) error {
		return fields(s.msg.of(c.src), func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
			if num != field || typ != protowire.BytesType {
				return nil
			}
			h.reset()
			if err := decodeHist(&h, b); err != nil {
				return err
			}
			fn(&h)
			return c.w.err
		})
	}
}

func decodeHist(h *nhist, b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v uint64, fb []byte) error {
		switch num {
		case 1:
			h.countInt = v
		case 2:
			h.countFloat, h.isFloat = math.Float64frombits(v), true
		case 3:
			h.sum = math.Float64frombits(v)
		case 4:
			h.schema = int32(protowire.DecodeZigZag(v))
		case 5:
			h.zeroThreshold = math.Float64frombits(v)
		case 6:
			h.zeroInt = v
		case 7:
			h.zeroFloat = math.Float64frombits(v)
		case 8, 11:
			sd := &h.pos
			if num == 8 {
				sd = &h.neg
			}
			if len(sd.spans) >= MaxBucketsPerPoint {
				return errBuckets
			}
			var sp bspan
			err := fields(fb, func(num protowire.Number, _ protowire.Type, v uint64, _ []byte) error {
				switch num {
				case 1:
					sp.offset = int32(protowire.DecodeZigZag(v))
				case 2:
					sp.length = uint32(v)
				}
				return nil
			})
			if err != nil {
				return err
			}
			sd.spans = append(sd.spans, sp)
		case 9, 12:
			sd := &h.pos
			if num == 9 {
				sd = &h.neg
			}
			return packed(typ, v, fb, func(x uint64) error {
				if len(sd.deltas) >= MaxBucketsPerPoint {
					return errBuckets
				}
				sd.deltas = append(sd.deltas, protowire.DecodeZigZag(x))
				return nil
			}, false)
		case 10, 13, 16:
			return packed(typ, v, fb, func(x uint64) error {
				switch num {
				case 10, 13:
					sd := &h.pos
					if num == 10 {
						sd = &h.neg
					}
					if len(sd.counts) >= MaxBucketsPerPoint {
						return errBuckets
					}
					sd.counts = append(sd.counts, math.Float64frombits(x))
				case 16:
					if len(h.custom) >= MaxBucketsPerPoint {
						return errBuckets
					}
					h.custom = append(h.custom, math.Float64frombits(x))
				}
				return nil
			}, true)
		case 14:
			h.resetHint = int32(v)
		case 15:
			h.ts = int64(v)
		case 17:
			h.start = int64(v)
		}
		return nil
	})
}

// packed walks a repeated scalar, packed or not.
func packed(typ protowire.Type, v uint64, b []byte, fn func(uint64) error, fixed bool) error {
	if typ != protowire.BytesType {
		return fn(v)
	}
	for len(b) > 0 {
		var x uint64
		var n int
		if fixed {
			x, n = protowire.ConsumeFixed64(b)
		} else {
			x, n = protowire.ConsumeVarint(b)
		}
		if n < 0 {
			return errTrunc
		}
		if err := fn(x); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Written sets remote write 2.0's answer headers (a v2 sender takes a
// success without them for a failure): the samples and native histograms
// written, counted from the converted request (a classic histogram point
// as its buckets, _sum and _count series' samples, a summary's as its
// quantiles, _sum and _count), exemplars 0 (not carried).
func Written(q *http.Request, otlp []byte, h http.Header) {
	_, params, _ := mime.ParseMediaType(q.Header.Get("Content-Type"))
	if params["proto"] != "io.prometheus.write.v2.Request" {
		return
	}
	var samples, hists int
	var container protowire.Number
	var walk func(b []byte, depth int, exp bool)
	walk = func(b []byte, depth int, exp bool) {
		_ = fields(b, func(num protowire.Number, typ protowire.Type, _ uint64, fb []byte) error {
			if typ != protowire.BytesType {
				return nil
			}
			switch depth {
			case 0, 1: // request → resource metrics → scope metrics
				if num == fReqResourceMetrics && depth == 0 || num == fRMScopeMetrics && depth == 1 {
					walk(fb, depth+1, false)
				}
			case 2:
				if num == fSMMetrics {
					walk(fb, 3, false)
				}
			case 3: // metric: its data container
				switch num {
				case fMetricGauge, fMetricSum, fMetricHistogram, fMetricSummary, fMetricExpHistogram:
					container = num
					walk(fb, 4, num == fMetricExpHistogram)
				}
			case 4:
				if num != fDataPoints {
					return nil
				}
				if exp {
					hists++
					return nil
				}
				// a classic histogram point was its buckets, _sum and
				// _count; a summary its quantiles, _sum and _count.
				n := 1
				_ = fields(fb, func(num protowire.Number, typ protowire.Type, _ uint64, b []byte) error {
					switch {
					case container == fMetricHistogram && num == fHDPBuckets && typ == protowire.BytesType:
						n += len(b) / 8
					case container == fMetricHistogram && num == fHDPSum, container == fMetricSummary && num == fSDPSum:
						n++
					case container == fMetricSummary && num == fSDPQuantiles:
						n++
					}
					return nil
				})
				samples += n
			}
			return nil
		})
	}
	walk(otlp, 0, false)
	h.Set("X-Prometheus-Remote-Write-Samples-Written", strconv.Itoa(samples))
	h.Set("X-Prometheus-Remote-Write-Histograms-Written", strconv.Itoa(hists))
	h.Set("X-Prometheus-Remote-Write-Exemplars-Written", "0")
}
