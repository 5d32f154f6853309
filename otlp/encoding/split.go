package encoding

import (
	"encoding/hex"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/wire"
)

// entry is one item (span, log record or metric) with where it came from.
type entry struct {
	res, resSchema []byte
	sc, scSchema   []byte
	hasRes, hasSc  bool
	item           []byte
	group          int
	items          int // telemetry items in item (data points of a metric)
}

// grouper collects entries of one request and the groups they fall in.
type grouper struct {
	entries []entry
	groups  []groupInfo
	byTrace map[[16]byte]int
	// byPart: for trace_partition, the group of each partition as
	// gen<<32 | group index; an entry of an older generation is empty, so
	// a request does not clear a slot per partition of the topic.
	byPart []uint64
	gen    uint32
	// order, start: each group's entries (see index); fill is scratch.
	order, start, fill []int32
	// chunk's scratch, kept so a request's split allocates nothing.
	size, cur []int
}

type groupInfo struct {
	traceID []byte
	res     wire.Resource
	resRaw  []byte
	items   int
	// partition is the group's partition when chosen (trace_partition).
	partition int32
	chosen    bool
}

func (g *grouper) reset() {
	g.entries = g.entries[:0]
	g.groups = g.groups[:0]
	clear(g.byTrace)
}

func sameSlice(a, b []byte) bool { return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0]) }

func newEntry(res *wire.Resource, sc *wire.Scope, item []byte) entry {
	return entry{res: res.Raw, resSchema: res.SchemaURL, sc: sc.Raw, scSchema: sc.SchemaURL,
		hasRes: res.Raw != nil, hasSc: sc.Raw != nil, item: item, items: 1}
}

func (g *grouper) add(res *wire.Resource, sc *wire.Scope, item []byte, traceID []byte) int {
	e := newEntry(res, sc, item)
	if traceID != nil {
		if g.byTrace == nil {
			g.byTrace = map[[16]byte]int{}
		}
		var k [16]byte
		copy(k[:], traceID)
		idx, ok := g.byTrace[k]
		if !ok {
			idx = len(g.groups)
			g.byTrace[k] = idx
			g.groups = append(g.groups, groupInfo{traceID: traceID, resRaw: res.Raw})
		}
		e.group = idx
	} else {
		// One group per resource message.
		if n := len(g.groups); n > 0 && sameSlice(g.groups[n-1].resRaw, res.Raw) {
			e.group = n - 1
		} else {
			g.groups = append(g.groups, groupInfo{res: *res, resRaw: res.Raw})
			e.group = len(g.groups) - 1
		}
	}
	g.groups[e.group].items++
	g.entries = append(g.entries, e)
	return e.group
}

// zeroTraceID stands for a missing trace id (read-only).
var zeroTraceID [16]byte

// maxGroupedPartitions: topics with more partitions are written a record
// per trace (trace_id's way, to the same partitions), so that an encoder's
// slot per partition stays small.
const maxGroupedPartitions = 1 << 16

// partitions readies grouping by partition for a topic of n partitions.
func (g *grouper) partitions(n int) {
	if len(g.byPart) < n {
		g.byPart = make([]uint64, n)
		g.gen = 0
	}
	g.gen++
	if g.gen == 0 { // wrapped: entries of generation 0 would look current
		clear(g.byPart)
		g.gen = 1
	}
}

// addTo adds an item to partition p's group (trace_partition): one record
// per partition a request reaches, whatever traces are in it.
func (g *grouper) addTo(res *wire.Resource, sc *wire.Scope, item []byte, p int32) {
	e := newEntry(res, sc, item)
	slot := g.byPart[p]
	if uint32(slot>>32) == g.gen {
		e.group = int(uint32(slot))
	} else {
		e.group = len(g.groups)
		g.byPart[p] = uint64(g.gen)<<32 | uint64(e.group)
		g.groups = append(g.groups, groupInfo{resRaw: res.Raw, partition: p, chosen: true})
	}
	g.groups[e.group].items++
	g.entries = append(g.entries, e)
}

// tracePartition is the partition Kafka's murmur2 partitioner (the Java
// client's, and the exporter's default, kgo.StickyKeyPartitioner) gives a
// record keyed by the hex trace id tid, among n: a trace lands where a
// record per trace would have, and where other producers keyed by the hex
// trace id with Kafka's default partitioner (the Java client's) put its
// other spans. (The Collector's partition_traces_by_id hashes its keys
// with FNV-1a, Sarama's way: not the same partitions.)
//
// A 16-byte id, every valid one, is hashed from a table of each byte's two
// hex digits, a 4-byte word of the key per two bytes of the id, without
// writing the key out (hex.Encode and the byte-wise loads were a third of
// this function on the hot path).
func tracePartition(tid []byte, n int) int32 {
	if len(tid) == 16 {
		const m, r = murmurM, murmurR
		h := murmurSeed ^ 32
		for i := 0; i < 16; i += 2 {
			k := uint32(hexPairs[tid[i]]) | uint32(hexPairs[tid[i+1]])<<16
			k *= m
			k ^= k >> r
			k *= m
			h *= m
			h ^= k
		}
		h ^= h >> 13
		h *= m
		h ^= h >> 15
		return int32(int(h&0x7fffffff) % n)
	}
	var key [32]byte
	hex.Encode(key[:], tid[:min(len(tid), 16)])
	return int32(int(murmur2(key[:2*min(len(tid), 16)])&0x7fffffff) % n)
}

// hexPairs[b] is b's two lower-case hex digits, the first in the low byte.
var hexPairs = func() (t [256]uint16) {
	const digits = "0123456789abcdef"
	for i := range t {
		t[i] = uint16(digits[i>>4]) | uint16(digits[i&15])<<8
	}
	return t
}()

const (
	murmurSeed uint32 = 0x9747b28c
	murmurM    uint32 = 0x5bd1e995
	murmurR           = 24
)

// murmur2 is Kafka's (org.apache.kafka.common.utils.Utils.murmur2).
func murmur2(b []byte) uint32 {
	const seed, m, r = murmurSeed, murmurM, murmurR
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		b = b[4:]
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

func tagged(b []byte) int { return 1 + protowire.SizeVarint(uint64(len(b))) + len(b) }

// index lists each group's entries in order (a counting sort by group):
// g.order[g.start[gi]:g.start[gi+1]] are group gi's entry indexes. Writing
// walks each group's own entries, so a request of many traces costs time
// linear in its items, not items × traces.
func (g *grouper) index() {
	n := len(g.groups)
	// Grow, then clear: reused scratch, and no allocation under the race
	// detector either (which does not elide append of make).
	g.start = slices.Grow(g.start[:0], n+1)[:n+1]
	clear(g.start)
	for i := range g.entries {
		g.start[g.entries[i].group+1]++
	}
	for gi := 1; gi <= n; gi++ {
		g.start[gi] += g.start[gi-1]
	}
	g.order = slices.Grow(g.order[:0], len(g.entries))[:len(g.entries)] // every slot is written below
	fill := append(g.fill[:0], g.start[:n]...)
	for i := range g.entries {
		gi := g.entries[i].group
		g.order[fill[gi]] = int32(i)
		fill[gi]++
	}
	g.fill = fill
}

// members is group gi's entries, in order.
func (g *grouper) members(gi int) []int32 { return g.order[g.start[gi]:g.start[gi+1]] }

// appendGroup writes the entries of group gi as one TracesData / LogsData /
// MetricsData: a run of entries with the same resource becomes one
// Resource<X>, a run with the same scope one Scope<X>. Sizes are computed
// before writing so every item is copied once.
func (g *grouper) appendGroup(out []byte, gi int) []byte {
	es, m := g.entries, g.members(gi)
	for i := 0; i < len(m); {
		// The resource run: this group's entries with the same resource.
		j := i
		for j < len(m) && sameSlice(es[m[j]].res, es[m[i]].res) {
			j++
		}
		first := &es[m[i]]
		resSize := 0
		for k := i; k < j; {
			l, sz := scopeRun(es, m, k, j)
			resSize += 1 + protowire.SizeVarint(uint64(sz)) + sz
			k = l
		}
		if first.hasRes {
			resSize += tagged(first.res)
		}
		if len(first.resSchema) > 0 {
			resSize += tagged(first.resSchema)
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(resSize))
		if first.hasRes {
			out = protowire.AppendTag(out, 1, protowire.BytesType)
			out = protowire.AppendBytes(out, first.res)
		}
		for k := i; k < j; {
			l, sz := scopeRun(es, m, k, j)
			sc := &es[m[k]]
			out = protowire.AppendTag(out, 2, protowire.BytesType)
			out = protowire.AppendVarint(out, uint64(sz))
			if sc.hasSc {
				out = protowire.AppendTag(out, 1, protowire.BytesType)
				out = protowire.AppendBytes(out, sc.sc)
			}
			for x := k; x < l; x++ {
				out = protowire.AppendTag(out, 2, protowire.BytesType)
				out = protowire.AppendBytes(out, es[m[x]].item)
			}
			if len(sc.scSchema) > 0 {
				out = protowire.AppendTag(out, 3, protowire.BytesType)
				out = protowire.AppendBytes(out, sc.scSchema)
			}
			k = l
		}
		if len(first.resSchema) > 0 {
			out = protowire.AppendTag(out, 3, protowire.BytesType)
			out = protowire.AppendBytes(out, first.resSchema)
		}
		i = j
	}
	return out
}

// groupSize is how many bytes appendGroup writes for group gi, computed
// without writing: the whole output is sized (and refused if over the
// bound) before any of it is built, and then written into one allocation.
func (g *grouper) groupSize(gi int) int {
	es, m := g.entries, g.members(gi)
	total := 0
	for i := 0; i < len(m); {
		j := i
		for j < len(m) && sameSlice(es[m[j]].res, es[m[i]].res) {
			j++
		}
		resSize := 0
		for k := i; k < j; {
			l, sz := scopeRun(es, m, k, j)
			resSize += 1 + protowire.SizeVarint(uint64(sz)) + sz
			k = l
		}
		if first := &es[m[i]]; first.hasRes {
			resSize += tagged(first.res)
		}
		if first := &es[m[i]]; len(first.resSchema) > 0 {
			resSize += tagged(first.resSchema)
		}
		total += 1 + protowire.SizeVarint(uint64(resSize)) + resSize
		i = j
	}
	return total
}

// scopeRun returns the end of the run of members starting at k (within
// [k, end)) that share k's scope, and the size of its Scope<X> message.
func scopeRun(es []entry, m []int32, k, end int) (int, int) {
	sc := &es[m[k]]
	size := 0
	if sc.hasSc {
		size += tagged(sc.sc)
	}
	if len(sc.scSchema) > 0 {
		size += tagged(sc.scSchema)
	}
	l := k
	for l < end && sameSlice(es[m[l]].sc, sc.sc) {
		size += tagged(es[m[l]].item)
		l++
	}
	return l, size
}

// chunk splits every group whose items would make a record over max bytes
// into several groups with the same key, in item order, so each record fits
// in Kafka. An item larger than max on its own becomes a group of its own,
// and Kafka's refusal of it is reported.
func (g *grouper) chunk(max int) {
	n := len(g.groups)
	g.size = slices.Grow(g.size[:0], n)[:n] // bytes of the current chunk of each group
	g.cur = slices.Grow(g.cur[:0], n)[:n]   // the group index the current chunk writes to
	size, cur := g.size, g.cur
	for i := range cur {
		size[i], cur[i] = 0, i
	}
	for i := range g.entries {
		e := &g.entries[i]
		orig := e.group
		sz := tagged(e.item) + tagged(e.sc) + tagged(e.res) + 16
		// The schema URLs are copied into every record too.
		if len(e.resSchema) > 0 {
			sz += tagged(e.resSchema)
		}
		if len(e.scSchema) > 0 {
			sz += tagged(e.scSchema)
		}
		if size[orig] > 0 && size[orig]+sz > max {
			info := g.groups[orig]
			info.items = 0
			g.groups = append(g.groups, info)
			cur[orig] = len(g.groups) - 1
			size[orig] = 0
		}
		size[orig] += sz
		if cur[orig] != orig {
			g.groups[orig].items -= e.items
			g.groups[cur[orig]].items += e.items
		}
		e.group = cur[orig]
	}
}

// split writes one record per trace, per partition (trace_partition) or
// per resource.
func (e *Encoder) split(sig Signal, c *Config, raw []byte, out []byte) ([]Part, []byte, int, error) {
	g := &e.group
	g.reset()
	n := 0
	byPart := c.Partition == "trace_partition" && e.Partitions > 0 && e.Partitions <= maxGroupedPartitions
	byTrace := c.Partition == "trace_id" || (c.Partition == "trace_partition" && !byPart)
	if byPart {
		g.partitions(e.Partitions)
	}
	single := c.Partition == "none" // one record for the whole (sampled) request
	switch sig {
	case Traces:
		it := wire.NewTraces(raw)
		for it.Next() {
			e.record(&it)
			if !e.Sample.Keep(it.Span().TraceID) {
				e.Dropped++
				continue
			}
			var tid []byte
			if byTrace || byPart {
				tid = it.Span().TraceID
				if len(tid) == 0 {
					// Spans without a trace id (absent or empty) share
					// one record, keyed (or placed) as the zero id.
					tid = zeroTraceID[:]
				}
			}
			if byPart {
				g.addTo(it.Resource(), it.Scope(), it.Span().Raw, tracePartition(tid, e.Partitions))
			} else {
				g.add(it.Resource(), it.Scope(), it.Span().Raw, tid)
			}
			if n++; e.MaxItems > 0 && n > e.MaxItems {
				return nil, out, 0, &LimitError{Items: true, Limit: e.MaxItems}
			}
		}
		if err := it.Err(); err != nil {
			return nil, out, 0, err
		}
	case Logs:
		it := wire.NewLogs(raw)
		for it.Next() {
			if !e.Sample.Keep(it.Record().TraceID) {
				e.Dropped++
				continue
			}
			g.add(it.Resource(), it.Scope(), it.Record().Raw, nil)
			if n++; e.MaxItems > 0 && n > e.MaxItems {
				return nil, out, 0, &LimitError{Items: true, Limit: e.MaxItems}
			}
		}
		if err := it.Err(); err != nil {
			return nil, out, 0, err
		}
	default:
		it := wire.NewMetrics(raw)
		var last []byte
		lastGroup := 0
		for it.Next() {
			if n++; e.MaxItems > 0 && n > e.MaxItems {
				return nil, out, 0, &LimitError{Items: true, Limit: e.MaxItems}
			}
			if m := it.Metric().Raw; !sameSlice(m, last) {
				lastGroup = g.add(it.Resource(), it.Scope(), m, nil)
				last = m
			} else {
				g.groups[lastGroup].items++ // items count data points, as OTLP's responses do
				g.entries[len(g.entries)-1].items++
			}
		}
		if err := it.Err(); err != nil {
			return nil, out, 0, err
		}
	}
	if single {
		for i := range g.entries {
			g.entries[i].group = 0
		}
		if len(g.groups) > 0 {
			g.groups = g.groups[:1]
			g.groups[0].items = n
		}
	}
	base := len(out)
	if e.MaxRecordBytes > 0 {
		g.chunk(e.MaxRecordBytes)
	}
	if c.Encoding == "otlp_proto" && len(g.groups) == 1 && e.Dropped == 0 &&
		(e.MaxRecordBytes <= 0 || len(raw) <= e.MaxRecordBytes) {
		// The request is one record (one resource, or one trace) with
		// nothing sampled out, as an SDK's usually is: its value is the
		// request as it came, not a copy of it, so it needs no index of
		// its groups either. An export request is LogsData (TracesData,
		// MetricsData) byte for byte, so this is the same data; what
		// rebuilding it would have changed is only its framing (runs of a
		// scope merged, empty messages and unknown fields left out), and
		// both forms decode to the same items.
		p := Part{Whole: true, Items: g.groups[0].items, ResRaw: g.groups[0].resRaw}
		out = e.appendKey(out, c, &g.groups[0], &p)
		if err := e.over(n, base, len(out)+len(raw), 1); err != nil {
			return nil, out, 0, err
		}
		e.parts = append(e.parts, p)
		return e.parts, out, n, nil
	}
	var scratch []byte
	g.index()
	if c.Encoding != "otlp_json" {
		// Protobuf output is sized exactly first: a request over the bound
		// is refused before a byte of it is built, and the rest is written
		// into one allocation instead of a growing (and garbage-making) one.
		total := 0
		for gi := range g.groups {
			total += g.groupSize(gi) + 32 // the value, and at most a 32-byte hex key
			if e.MaxBytes > 0 && total+(gi+1)*e.RecordCost > e.MaxBytes {
				return nil, out, 0, &LimitError{Limit: e.MaxBytes}
			}
		}
		out = slices.Grow(out, total)
	}
	for gi := range g.groups {
		// Checked before each group is written: one group copies at most
		// the request once (each resource once per run), so the output
		// never passes MaxBytes by more than the request's own size.
		if err := e.over(n, base, len(out), gi); err != nil {
			return nil, out, 0, err
		}
		p := Part{Items: g.groups[gi].items, ResRaw: g.groups[gi].resRaw}
		out = e.appendKey(out, c, &g.groups[gi], &p)
		p.ValStart = len(out)
		if c.Encoding == "otlp_json" {
			scratch = g.appendGroup(scratch[:0], gi)
			var err error
			if out, err = appendJSON(sig, scratch, out); err != nil {
				return nil, out, 0, err
			}
		} else {
			out = g.appendGroup(out, gi)
		}
		p.ValEnd = len(out)
		e.parts = append(e.parts, p)
	}
	if err := e.over(n, base, len(out), len(e.parts)); err != nil {
		return nil, out, 0, err
	}
	return e.parts, out, n, nil
}

// appendKey appends group gr's key to out and records where it is in p:
// the hex trace id, or the resource's hash; none for partition none, nor
// for a group whose partition is chosen (p records it instead).
func (e *Encoder) appendKey(out []byte, c *Config, gr *groupInfo, p *Part) []byte {
	switch {
	case gr.chosen:
		p.Partition, p.Chosen = gr.partition, true
		return out
	case c.Partition == "none":
		return out
	case c.Partition == "trace_id" || c.Partition == "trace_partition":
		p.KeyStart = len(out)
		out = hex.AppendEncode(out, gr.traceID)
	default:
		p.KeyStart = len(out)
		out = e.hash.appendKey(out, &gr.res)
	}
	p.KeyEnd = len(out)
	return out
}
