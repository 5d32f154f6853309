package spool

// Read-only tools: what a spool directory holds and what the next Open
// would make of it, without changing a byte of it (ferry spool inspect,
// verify and dump; ferry validate).
//
// They read the directory as recovery and the reader do — the same
// directory listing, checkpoint, segment headers, frame scan and record
// decoder — and predict what those would do instead of doing it: which
// segments Open deletes as acknowledged, what it truncates off the newest
// segment or removes, where reading resumes, which damaged bytes the
// reader skips, and which records are sent to Kafka again. Files are
// opened read-only; nothing is created, truncated, renamed or deleted.
//
// A running agent holds an exclusive flock on the directory's lock file
// (Open). The tools take a shared one on the same file for as long as they
// read, so they refuse a spool in use (ErrInUse) unless forced, and an
// agent started meanwhile fails to open the spool instead of changing it
// under them. Forced on a running agent (Force), they read files that are
// changing: the newest segment's last frame may be a write in progress,
// and segments may disappear as Kafka acknowledges them.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/record"
)

// ErrInUse is returned by Inspect and Scan when a running agent holds the
// spool directory.
var ErrInUse = errors.New("the spool is in use by a running ferry")

// ErrNoSpool is returned when the directory does not exist (an agent
// creates it at its first start in spool or spill mode).
var ErrNoSpool = errors.New("no spool directory")

// ReadOptions tune Inspect and Scan.
type ReadOptions struct {
	// Force reads a spool that a running agent holds (Report.Live).
	Force bool
	// MaxRecordBytes is the agent's largest record (Links.MaxRecordBytes,
	// the exporter's max_batch_bytes); it bounds only the frames of old
	// (FRYSPL01) segments, which record no limit of their own. 0: 8 MiB.
	MaxRecordBytes int
	// PendingOnly (Scan): only the records a restart would send to Kafka.
	PendingOnly bool
}

// Position is a place in the spool: a segment and a byte offset in it.
type Position struct {
	Segment string `json:"segment"`
	Offset  int64  `json:"offset"`
}

// Segment states, by the checkpoint.
const (
	// StateAcknowledged: every record was acknowledged. Open deletes it
	// (its deletion was interrupted) if it is before the checkpoint's
	// segment (DeletedAtStart); the checkpoint's own is retired once the
	// reader has passed it.
	StateAcknowledged = "acknowledged"
	// StatePartly: the checkpoint is inside it; the records after it are
	// pending.
	StatePartly = "partly acknowledged"
	// StatePending: every record in it is sent to Kafka at the next start.
	StatePending = "pending"
	// StateRemoved: the newest segment has no valid header; Open removes it.
	StateRemoved = "removed at start"
)

// Damage kinds.
const (
	DamageHeader    = "segment_header"   // the segment's header: its frames cannot be trusted
	DamageTornTail  = "torn_tail"        // bytes after the newest segment's last valid frame
	DamageFrame     = "damaged_frames"   // bytes between valid frames that no frame starts at
	DamageMalformed = "malformed_record" // a frame whose checksum matches but whose record does not decode
)

// Damage is one damaged stretch of a segment and what the next start does
// with it.
type Damage struct {
	Segment string `json:"segment"`
	Offset  int64  `json:"offset"`
	Bytes   int64  `json:"bytes"`
	Kind    string `json:"kind"`
	// Detail says what is wrong at Offset (bad frame length, tag,
	// checksum, a frame cut short...).
	Detail string `json:"detail"`
	// Frames, when known (not 0), is how many whole frames the stretch
	// holds: the records it costs.
	Frames int `json:"frames,omitempty"`
	// Action is what recovery or the reader does: truncated, skipped,
	// segment removed, or nothing (acknowledged data, deleted anyway).
	Action string `json:"action"`
	// Pending: the stretch is in data a restart reads (not acknowledged),
	// so the records in it are lost.
	Pending bool `json:"pending"`
}

// SegmentReport is one segment file.
type SegmentReport struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	Format string `json:"format"` // FRYSPL02, FRYSPL01, or "" (no valid header)
	// Recycled: written over an earlier segment's file; bytes past its last
	// frame are that file's old ones, trimmed at start without counting
	// as damage (StaleBytes).
	Recycled   bool  `json:"recycled,omitempty"`
	StaleBytes int64 `json:"stale_bytes,omitempty"`
	// Frames counts valid frames; Records those that decode.
	Frames  int `json:"frames"`
	Records int `json:"records"`
	// First and Last are the offsets of the first and last valid frames
	// (-1: none); FirstTime and LastTime the first and last record
	// timestamps (zero: none).
	First     int64     `json:"first"`
	Last      int64     `json:"last"`
	FirstTime time.Time `json:"first_time,omitzero"`
	LastTime  time.Time `json:"last_time,omitzero"`
	State     string    `json:"state"`
	// DeletedAtStart: before the checkpoint's segment; Open deletes it.
	DeletedAtStart bool `json:"deleted_at_start,omitempty"`
	// Pending records and their frame bytes: what a restart sends again.
	Pending      int      `json:"pending"`
	PendingBytes int64    `json:"pending_bytes"`
	Damage       []Damage `json:"damage,omitempty"`
}

// TopicReport counts one topic's records.
type TopicReport struct {
	Topic        string `json:"topic"`
	Records      int    `json:"records"`
	Bytes        int64  `json:"bytes"`
	Pending      int    `json:"pending"`
	PendingBytes int64  `json:"pending_bytes"`
}

// Report is what Inspect found.
type Report struct {
	Dir string `json:"dir"`
	// Live: a running agent holds the spool and it was read anyway (Force).
	Live bool `json:"live"`
	// Checkpoint as written (nil: none); CheckpointError when unreadable
	// (a restart then replays every segment from its start).
	Checkpoint      *Position `json:"checkpoint"`
	CheckpointError string    `json:"checkpoint_error,omitempty"`
	// ReplayFrom is where the next start resumes reading (nil: nothing
	// to read).
	ReplayFrom *Position       `json:"replay_from"`
	Segments   []SegmentReport `json:"segments"`
	Spares     []string        `json:"spares,omitempty"`
	Topics     []TopicReport   `json:"topics"`
	// Replay: records the next start sends to Kafka, and the backlog bytes
	// it reads (ferry_spool_backlog_at_start_bytes).
	ReplayRecords int   `json:"replay_records"`
	ReplayBytes   int64 `json:"replay_bytes"`
	// Damage lists every damaged stretch, in file order.
	Damage []Damage `json:"damage"`
}

// Damaged reports whether any damage was found.
func (r *Report) Damaged() bool { return len(r.Damage) > 0 }

// Lost is the damaged bytes in data a restart would read: records lost.
func (r *Report) Lost() (bytes int64, stretches int) {
	for _, d := range r.Damage {
		if d.Pending {
			bytes += d.Bytes
			stretches++
		}
	}
	return bytes, stretches
}

// Entry is one record Scan found. Record's bytes are valid only during
// the call.
type Entry struct {
	Position
	// Pending: a restart sends it to Kafka again.
	Pending bool
	Record  *record.Record
}

// view is a spool directory opened read-only, with the plan of what the
// next Open would do.
type view struct {
	dir    string
	lock   *os.File
	live   bool
	maxV1  int
	ids    []uint64 // every segment on disk
	spares []string
	ckpt   *pos // as written
	ckErr  error
	// acked: segments before it are acknowledged (Open deletes them).
	acked uint64
	// from is where the reader starts, in the first segment kept (none:
	// nothing is left to read).
	from    pos
	hasFrom bool
	// newest is the segment whose tail Open repairs (repair), or removes
	// when its header is not valid (removed).
	newest          uint64
	repair, removed bool
}

func openView(dir string, o ReadOptions) (*view, error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoSpool, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("spool: %s is not a directory", dir)
	}
	v := &view{dir: dir, maxV1: max(o.MaxRecordBytes+4096, 8<<20+4096)}
	lf, err := lockShared(dir)
	switch {
	case errors.Is(err, ErrInUse) && o.Force:
		v.live = true
	case err != nil:
		return nil, err
	default:
		v.lock = lf
	}
	if err := v.plan(); err != nil {
		v.close()
		return nil, err
	}
	return v, nil
}

// lockShared takes a shared lock on dir's lock file, which a running
// agent holds exclusively (ErrInUse). The lock file is never created here:
// a directory without one was never opened by an agent (nil, nil).
func lockShared(dir string) (*os.File, error) {
	lf, err := os.Open(filepath.Join(dir, "lock"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s is locked)", ErrInUse, lf.Name())
		}
		return nil, fmt.Errorf("spool: locking %s: %w", lf.Name(), err)
	}
	return lf, nil
}

// Hold keeps an agent from opening the spool in dir until release is
// called, as the read-only tools do while they read (a shared lock on its
// lock file): ErrInUse if an agent holds it now. ferry deadletter replay
// holds it while it rewrites the dead-letter file, which a running agent
// appends to, so unlike the read-only tools it creates what it must lock:
// the directory (0700) and its lock file (0600), as the agent would, owned
// by the owner of the nearest directory above when run as root — a replay
// run with sudo must not leave a lock the agent's own user cannot open.
// Without them an agent started during the replay would lock a file of its
// own and append dead letters the replay then renames over.
func Hold(dir string) (release func(), err error) {
	if _, err := os.Stat(filepath.Join(dir, "lock")); errors.Is(err, os.ErrNotExist) {
		if err := makeLock(dir); err != nil {
			return nil, err
		}
	}
	lf, err := lockShared(dir)
	if err != nil {
		return nil, err
	}
	return func() {
		if lf != nil {
			lf.Close()
		}
	}, nil
}

// makeLock creates dir (and the directories above it that are missing)
// and its lock file, as spool.Open does. Run as root, what it creates
// goes to the owner of the nearest directory that already existed.
func makeLock(dir string) error {
	dir = filepath.Clean(dir)
	var made []string // from dir upwards
	owner := dir
	for {
		if _, err := os.Stat(owner); err == nil || owner == filepath.Dir(owner) {
			break
		}
		made = append(made, owner)
		owner = filepath.Dir(owner)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	lock := filepath.Join(dir, "lock")
	lf, err := os.OpenFile(lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	lf.Close()
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := os.Stat(owner)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	for _, p := range append(made, lock) {
		if err := os.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
	}
	return nil
}

func (v *view) close() {
	if v.lock != nil {
		v.lock.Close() // releases the shared lock
		v.lock = nil
	}
}

func (v *view) path(id uint64) string { return filepath.Join(v.dir, segName(id)) }

// plan works out what recover() would do, without doing it.
func (v *view) plan() error {
	ids, spares, err := listDir(v.dir)
	if err != nil {
		return err
	}
	v.ids, v.spares = ids, spares
	cp, ok, err := readCheckpoint(filepath.Join(v.dir, "checkpoint"))
	if err != nil {
		v.ckErr, ok = err, false
	}
	if ok {
		c := cp
		v.ckpt = &c
	}
	if !ok && len(ids) > 0 {
		cp = pos{ids[0], 0}
	}
	v.acked = cp.seg
	kept := slices.DeleteFunc(slices.Clone(ids), func(id uint64) bool { return id < cp.seg })
	if len(kept) > 0 {
		v.newest, v.repair = kept[len(kept)-1], true
		if _, err := readSegFormat(v.path(v.newest)); err != nil && !errors.Is(err, os.ErrNotExist) {
			// recover() removes a newest segment without a valid header.
			kept, v.removed = kept[:len(kept)-1], true
		}
	}
	if len(kept) > 0 && (cp.seg != kept[0] || cp.off < 0) {
		cp = pos{kept[0], 0}
	}
	v.from, v.hasFrom = cp, len(kept) > 0
	return nil
}

// segment is one segment file as the walk found it.
type segment struct {
	id     uint64
	f      *os.File
	size   int64 // on disk
	sf     *segFormat
	hdrErr error
	acked  bool // before the checkpoint's segment: Open deletes it
	// removed: the newest segment, without a valid header: Open removes it.
	removed bool
	start   int64 // the reader's first byte in it: what comes before is acknowledged
}

// segment opens segment id read-only; nil without error if it is gone
// (an agent running meanwhile retired it).
func (v *view) segment(id uint64) (*segment, error) {
	f, err := os.Open(v.path(id))
	if errors.Is(err, os.ErrNotExist) && v.live {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("spool: %w", err)
	}
	sg := &segment{id: id, f: f, size: fi.Size(), acked: id < v.acked, removed: v.removed && id == v.newest}
	var hdr [segHeader]byte
	n, _ := f.ReadAt(hdr[:], 0)
	sg.sf, sg.hdrErr = parseSegHeader(hdr[:n])
	if sg.sf != nil && sg.sf.v1 {
		sg.sf.maxFrame = v.maxV1
	}
	switch {
	case sg.acked || sg.removed:
		sg.start = sg.size
	case id == v.from.seg && sg.sf != nil:
		sg.start = max(v.from.off, sg.sf.dataStart())
	case sg.sf != nil:
		sg.start = sg.sf.dataStart()
	}
	return sg, nil
}

// walk calls fn for every valid frame of every segment on disk, in order,
// with whether a restart reads it and its record (nil if it does not
// decode); seg is called before each segment's frames, end after them with
// where the last valid frame ended. fn returning false stops the walk.
func (v *view) walk(seg func(*segment), fn func(sg *segment, off int64, hl int, payload []byte, r *record.Record, pending bool) bool,
	end func(sg *segment, validEnd int64)) error {
	var dec decoder
	r := &record.Record{}
	for _, id := range v.ids {
		sg, err := v.segment(id)
		if err != nil {
			return err
		}
		if sg == nil {
			continue
		}
		if seg != nil {
			seg(sg)
		}
		if sg.sf == nil {
			sg.f.Close()
			continue
		}
		validEnd := sg.sf.dataStart()
		stopped := false
		err = walkFrames(sg.f, sg.size, sg.sf.dataStart(), sg.sf, 1<<20, func(off int64, p []byte) bool {
			validEnd = off + int64(sg.sf.hdrLen()) + int64(len(p))
			rec := r
			// No previous record to share headers with: each record is
			// handed to fn alone, its memory reused for the next.
			if dec.decode(p, r, nil) != nil {
				rec = nil
			}
			if !fn(sg, off, sg.sf.hdrLen(), p, rec, off >= sg.start) {
				stopped = true
				return false
			}
			return true
		})
		if err == nil && end != nil && !stopped {
			end(sg, validEnd)
		}
		sg.f.Close()
		if err != nil {
			return fmt.Errorf("spool: reading %s: %w", segName(id), err)
		}
		if stopped {
			return nil
		}
	}
	return nil
}

// Inspect reads the spool in dir and reports its segments, records,
// damage and what the next start would replay, without changing it.
func Inspect(dir string, o ReadOptions) (*Report, error) {
	v, err := openView(dir, o)
	if err != nil {
		return nil, err
	}
	defer v.close()
	rep := &Report{Dir: dir, Live: v.live, Segments: []SegmentReport{}, Topics: []TopicReport{}, Damage: []Damage{}, Spares: v.spares}
	if v.ckpt != nil {
		rep.Checkpoint = &Position{segName(v.ckpt.seg), v.ckpt.off}
	}
	if v.ckErr != nil {
		rep.CheckpointError = v.ckErr.Error()
	}
	topics := map[string]*TopicReport{}
	var cur *SegmentReport
	var expect int64 // where the next frame should start
	gap := func(sg *segment, from, to int64, kind, action string) {
		if to <= from {
			return
		}
		d := Damage{Segment: segName(sg.id), Offset: from, Bytes: to - from, Kind: kind, Action: action,
			Pending: to > sg.start}
		d.Detail, d.Frames = describe(sg, from, to)
		cur.Damage = append(cur.Damage, d)
	}
	ids := map[string]uint64{}
	err = v.walk(func(sg *segment) {
		ids[segName(sg.id)] = sg.id
		rep.Segments = append(rep.Segments, SegmentReport{Name: segName(sg.id), Size: sg.size, First: -1, Last: -1})
		cur = &rep.Segments[len(rep.Segments)-1]
		switch {
		case sg.acked:
			cur.State, cur.DeletedAtStart = StateAcknowledged, true
		case sg.removed:
			cur.State = StateRemoved
		case sg.id == v.from.seg && sg.sf != nil && sg.start > sg.sf.dataStart():
			cur.State = StatePartly
		default:
			cur.State = StatePending
		}
		if sg.sf == nil {
			d := Damage{Segment: segName(sg.id), Bytes: sg.size, Kind: DamageHeader, Detail: sg.hdrErr.Error(), Pending: !sg.acked}
			switch {
			case sg.acked:
				d.Action = "none: acknowledged, deleted at start"
			case sg.removed:
				d.Action = "segment removed at start"
			default:
				d.Action = "segment skipped by the reader"
			}
			cur.Damage = append(cur.Damage, d)
			return
		}
		cur.Format, cur.Recycled = segMagic, sg.sf.recycled
		if sg.sf.v1 {
			cur.Format = segMagicV1
		}
		expect = sg.sf.dataStart()
	}, func(sg *segment, off int64, hl int, p []byte, r *record.Record, pending bool) bool {
		if off > expect {
			// Bytes no valid frame starts at, before one that does.
			gap(sg, expect, off, DamageFrame, skippedAction(sg))
		}
		expect = off + int64(hl) + int64(len(p))
		cur.Frames++
		if cur.First < 0 {
			cur.First = off
		}
		cur.Last = off
		if r == nil {
			cur.Damage = append(cur.Damage, Damage{Segment: segName(sg.id), Offset: off, Bytes: int64(hl + len(p)), Kind: DamageMalformed,
				Detail: "the checksum matches but the record does not decode", Frames: 1, Action: skippedAction(sg), Pending: pending})
			return true
		}
		cur.Records++
		if !r.Timestamp.IsZero() {
			if cur.FirstTime.IsZero() {
				cur.FirstTime = r.Timestamp.UTC()
			}
			cur.LastTime = r.Timestamp.UTC()
		}
		t := topics[r.Topic]
		if t == nil {
			t = &TopicReport{Topic: r.Topic}
			topics[r.Topic] = t
		}
		size := int64(hl + len(p))
		t.Records++
		t.Bytes += size
		if pending {
			t.Pending++
			t.PendingBytes += size
			cur.Pending++
			cur.PendingBytes += size
			rep.ReplayRecords++
		}
		return true
	}, func(sg *segment, validEnd int64) {
		switch {
		case validEnd >= sg.size:
		case v.repair && sg.id == v.newest && sg.sf.recycled:
			// recover() trims a recycled file's old bytes silently.
			cur.StaleBytes = sg.size - validEnd
		case v.repair && sg.id == v.newest:
			action := "truncated at start"
			if v.live {
				action = "truncated at the next start, unless it is a write in progress (the agent is running)"
			}
			gap(sg, validEnd, sg.size, DamageTornTail, action)
		default:
			gap(sg, validEnd, sg.size, DamageFrame, skippedAction(sg))
		}
	})
	if err != nil {
		return nil, err
	}
	for i := range rep.Segments {
		s := &rep.Segments[i]
		if s.State == StatePartly && s.Pending == 0 {
			// The checkpoint is at its end: the reader starts at the next.
			s.State = StateAcknowledged
		}
		rep.Damage = append(rep.Damage, s.Damage...)
		// The backlog the next start reads, as Backlog() counts it after
		// recovery: the newest segment cut at its last valid frame.
		if s.State == StateAcknowledged || s.State == StateRemoved {
			continue
		}
		size, start := s.Size, segHeader
		if s.Format == segMagicV1 {
			start = segHeaderV1
		}
		id := ids[s.Name]
		if v.repair && id == v.newest {
			size -= s.StaleBytes
			for _, d := range s.Damage {
				if d.Kind == DamageTornTail {
					size -= d.Bytes
				}
			}
		}
		if id == v.from.seg {
			start = max(start, min(v.from.off, size))
		}
		rep.ReplayBytes += max(0, size-start)
	}
	if v.hasFrom {
		rep.ReplayFrom = &Position{segName(v.from.seg), v.from.off}
	}
	for _, t := range topics {
		rep.Topics = append(rep.Topics, *t)
	}
	slices.SortFunc(rep.Topics, func(a, b TopicReport) int {
		if a.Topic < b.Topic {
			return -1
		}
		if a.Topic > b.Topic {
			return 1
		}
		return 0
	})
	return rep, nil
}

func skippedAction(sg *segment) string {
	switch {
	case sg.acked:
		return "none: acknowledged, deleted at start"
	case sg.sf.v1:
		return "skipped by the reader with the rest of the segment (an old-format segment ends at its first damage)"
	}
	return "skipped by the reader, which resumes at the next valid frame"
}

// describe says what is wrong at from, the first byte of a damaged stretch
// ending at to, and how many whole frames the stretch holds if its frame
// headers still chain from one to the next up to its end (0: unknown).
func describe(sg *segment, from, to int64) (string, int) {
	f, sf, hl := sg.f, sg.sf, int64(sg.sf.hdrLen())
	var h [frameHeader]byte
	n, _ := f.ReadAt(h[:hl], from)
	length := int64(0)
	if int64(n) == hl {
		length = int64(leU32(h[:]))
	}
	var what string
	switch {
	case int64(n) < hl || from+hl > sg.size:
		return fmt.Sprintf("a frame header cut short (%d of %d bytes)", sg.size-from, hl), 0
	case length == 0 || length > int64(sf.maxFrame):
		what = fmt.Sprintf("bad frame length %d (limit %d)", length, sf.maxFrame)
	case !sf.v1 && leU32(h[4:]) != sf.tag:
		what = "bad frame tag (not a frame of this segment)"
	case from+hl+length > sg.size:
		what = fmt.Sprintf("a frame cut short: %d bytes announced, %d in the file", length, sg.size-from-hl)
	default:
		what = "checksum mismatch"
	}
	// Count the frames whose headers chain up to the end of the stretch.
	frames, at := 0, from
	for at+hl <= to && frames < 1<<20 {
		if _, err := f.ReadAt(h[:hl], at); err != nil && !errors.Is(err, io.EOF) {
			break
		}
		l := int64(leU32(h[:]))
		if l == 0 || l > int64(sf.maxFrame) || at+hl+l > to {
			break
		}
		at += hl + l
		frames++
	}
	if at != to {
		frames = 0
	}
	return what, frames
}

func leU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// Scan calls fn with every record in the spool in dir, in the order the
// reader sends them (PendingOnly: only those a restart sends), without
// changing the spool; fn returning false stops it. Damaged bytes and
// frames that do not decode are passed over (Inspect reports them).
func Scan(dir string, o ReadOptions, fn func(*Entry) bool) error {
	v, err := openView(dir, o)
	if err != nil {
		return err
	}
	defer v.close()
	var e Entry
	return v.walk(nil, func(sg *segment, off int64, _ int, _ []byte, r *record.Record, pending bool) bool {
		if r == nil || o.PendingOnly && !pending {
			return true
		}
		e = Entry{Position: Position{segName(sg.id), off}, Pending: pending, Record: r}
		return fn(&e)
	}, nil)
}
