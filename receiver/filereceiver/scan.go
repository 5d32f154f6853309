package filereceiver

// The poll: matching the globs, knowing files again, rotation and
// truncation.

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryhq/ferry/record"
)

// file is one file being read. The run goroutine owns it, except the
// fields marked as guarded by Receiver.mu, which completions change.
type file struct {
	id    fileID
	path  string // where first seen: its headers, key and topic
	cur   string // where last seen ("" when gone from the globs)
	group int    // the include glob it matched (metrics)
	fp    []byte // its first bytes, up to fingerprint_bytes (setFP)
	fpH   string // fpHash(fp), for the checkpoint: hashed once, not under Receiver.mu
	f     *os.File
	used  uint64 // the round it was last read in (LRU)
	size  int64  // its size as last seen
	// readOff is the first byte not yet read into a span; examined the
	// end of what was looked at (a partial last line lies between them):
	// nothing is read until the file grows past it.
	readOff, examined int64
	lineHint          int  // bytes per line of the last read
	inLong            bool // the last piece sent was part of a line longer than max_line_bytes
	held              bool // a multiline group at readOff may still grow
	heldAt            time.Time
	orphan            bool // renamed out of the globs or deleted: read to its end, then let go
	still             time.Time
	released          bool
	pending           *span // refused retryably: handed on again at retryAt
	retryAt           time.Time
	seen              uint64 // the poll it was last found in
	topic             string
	key               []byte
	pathV             []byte          // the ferry.file.path header's value
	extra             []record.Header // headers:, expanded for this file
	// gzip (gzip.go): read through a decompressor; size is decompressed.
	gz            bool
	zr            *gzip.Reader
	zpos          int64  // the decompressed offset zr is at
	zsize, zTried int64  // the compressed sizes size was taken at, and last failed at
	decided       bool   // its start offset is known (gzip files wait for rotations to end)
	unsaved       bool   // not in a checkpoint written yet: not read until it is
	first         bool   // a copytruncate copy under the globs: drained before its path's file (in Receiver.orphans)
	born          uint64 // its generation (entry.Born): of two orphans of a path, the older is read first

	// Guarded by Receiver.mu.
	gen       uint64  // bumped when the file is read again from an offset: older spans no longer count
	spans     []*span // handed on and not complete, oldest first
	committed int64   // every line before it is durable
	inflight  int64   // bytes of its spans (and pending) held
	rewind    bool    // a span failed retryably: read again from committed
}

// scan matches the globs, knows each file again or adds it, and finds the
// files that left: a rotation, a deletion or a truncation.
func (r *Receiver) scan(now time.Time) {
	r.scanGen++
	var unopened map[fileID]bool // checkpointed files matched but not opened
	for _, m := range r.match() {
		fi, err := os.Stat(m.path)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		id, ok := idOf(fi)
		if !ok {
			continue
		}
		if f := r.files[id]; f != nil {
			if f.seen == r.scanGen {
				continue // the same file under a second name (a link)
			}
			f.seen = r.scanGen
			if f.cur != m.path {
				// Renamed within the globs (app.log -> app.log.1 with both
				// included), or back from outside them.
				r.fm.rotations.WithLabelValues(r.cfg.Include[f.group]).Inc()
				f.cur = m.path
				r.setOrphan(f, false)
			}
			r.observe(f, fi.Size(), now)
			continue
		}
		if !r.discover(m.path, m.group, id, fi.Size(), now) {
			if _, ok := r.saved[id]; ok {
				if unopened == nil {
					unopened = map[fileID]bool{}
				}
				unopened[id] = true
			}
		}
	}
	if r.firstScan {
		r.firstScan = false
		// The first scan always leaves a checkpoint, even of no file:
		// start_at applies to the very first start only, and a restart
		// must read the files that appeared meanwhile from their start.
		if !r.hadCheckpoint {
			r.mu.Lock()
			r.dirty = true
			r.mu.Unlock()
		}
		// Files of the checkpoint not under the globs any more were
		// perhaps rotated while ferry was stopped: read them to their end.
		for id, e := range r.saved {
			if unopened[id] {
				continue
			}
			path := e.Current
			if path == "" {
				path = e.Path
			}
			if p, size, ok, _ := findInDir(filepath.Dir(path), id); ok {
				f := r.adopt(e.Path, p, 0, id, size, now, &e)
				if f != nil {
					r.setOrphan(f, true)
				}
			}
		}
		if r.hadCheckpoint && !r.ckptTime.IsZero() {
			r.adoptRotatedSince(now)
		}
	}
	// A checkpointed file that could not be opened keeps its entry (and its
	// offset) for the next poll; the others are known or gone.
	if len(r.saved) > 0 {
		r.mu.Lock()
		for id := range r.saved {
			if !unopened[id] {
				delete(r.saved, id)
			}
		}
		r.dirty = true
		r.mu.Unlock()
	}
	for _, f := range r.list {
		if f.seen == r.scanGen || f.released {
			continue
		}
		if f.cur != "" {
			// Not matched: renamed or deleted, unless the glob missed it (a
			// directory unreadable for a moment, out of descriptors):
			// only a file gone from where it was is a rotation, else a
			// whole file would be let go and read again when matched.
			fi, err := os.Stat(f.cur)
			if err == nil && sameID(fi, f.id) {
				r.observe(f, fi.Size(), now)
				continue
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				continue // cannot tell now: the next poll looks again
			}
		}
		if f.f != nil {
			if !f.orphan {
				r.fm.rotations.WithLabelValues(r.cfg.Include[f.group]).Inc()
				f.cur = ""
				r.setOrphan(f, true)
				f.still = now
			}
			if fi, err := f.f.Stat(); err == nil {
				r.observe(f, fi.Size(), now)
			}
			continue
		}
		// Closed (max_open_files) and gone from the globs: look for it by
		// inode where it was, to read it to its end.
		if f.cur != "" {
			p, size, ok, err := findInDir(filepath.Dir(f.cur), f.id)
			if err != nil {
				continue // the directory cannot be read now: looked for again
			}
			if ok {
				if !f.orphan {
					r.fm.rotations.WithLabelValues(r.cfg.Include[f.group]).Inc()
					r.setOrphan(f, true)
					f.still = now
				}
				f.cur = p
				r.observe(f, size, now)
				continue
			}
		}
		if f.examined < f.size {
			r.m.Error("file_gone")
			r.log.Log(slog.LevelWarn, "gone", "files: a file was removed before it was read to its end", "path", f.path, "unread_bytes", f.size-f.examined)
		}
		f.released = true
	}
	r.gauges()
}

// setOrphan marks f as renamed away or deleted (or back).
func (r *Receiver) setOrphan(f *file, on bool) {
	if f.orphan == on {
		return
	}
	f.orphan = on
	if on {
		r.orphans = append(r.orphans, f)
	}
}

type match struct {
	path  string
	group int
}

// match lists the files of the include globs not excluded, each once,
// with the first glob that matched it.
func (r *Receiver) match() []match {
	var out []match
	seen := map[string]bool{}
	for g, pat := range r.cfg.Include {
		paths, _ := r.glob(pat) // patterns are checked by Check
		for _, p := range paths {
			if seen[p] || r.excluded(p) {
				continue
			}
			seen[p] = true
			out = append(out, match{p, g})
		}
	}
	return out
}

func (r *Receiver) excluded(p string) bool {
	for _, ex := range r.cfg.Exclude {
		if ok, _ := filepath.Match(ex, p); ok {
			return true
		}
	}
	return false
}

// observe takes a file's current size: a file shorter than it was, or
// than what was read, was truncated (copytruncate) and is read again from
// its start. Against the size last seen, not only the position read: a
// reader behind its file (ferry busy with many files) would otherwise miss
// a truncation as soon as the file grew again past that position, and read
// on in the new content from the old offset.
func (r *Receiver) observe(f *file, size int64, now time.Time) {
	if f.gz {
		size = r.gzSize(f, nil, size)
	}
	if size < f.size || size < f.examined || size < f.readOff || r.replaced(f, size) {
		r.recoverCopy(f, now)
		r.truncated(f)
	}
	if (f.orphan || f.first) && size != f.size {
		f.still = now
	}
	f.size = size
	// Refilled at every poll, not only by a read: a file truncated again
	// before ferry read its new content (busy elsewhere, or held back by
	// its in-flight limits) must still have first bytes to find its copy by.
	if f.f == nil && len(f.fp) == 0 {
		r.fillClosedFP(f)
	} else {
		r.fillFP(f)
	}
}

// fillClosedFP gives a closed file (max_open_files) whose fingerprint is
// empty — truncated since it was last read — its first bytes, opening it
// only for that: without them a second truncation before it is read again
// would find no copy. A closed file with a fingerprint is compared when it
// is opened again (ensureOpen).
func (r *Receiver) fillClosedFP(f *file) {
	if f.cur == "" || f.gz || f.size == 0 {
		return
	}
	fd, err := os.Open(f.cur)
	if err != nil {
		return
	}
	defer fd.Close()
	if fi, err := fd.Stat(); err != nil || !sameID(fi, f.id) {
		return
	}
	f.setFP(readPrefix(fd, r.cfg.FingerprintBytes, f.size))
}

// replaced: an open file that did not get shorter between two polls no
// longer starts with its fingerprint — truncated and written past its old
// size while a poll stalled (checkpoint fsyncs on a slow disk). One read
// of at most fingerprint_bytes per open file per poll; a closed file is
// checked when it is opened again (ensureOpen).
func (r *Receiver) replaced(f *file, size int64) bool {
	if f.f == nil || f.gz || len(f.fp) == 0 || size < int64(len(f.fp)) {
		return false
	}
	if cap(r.fpBuf) < len(f.fp) {
		r.fpBuf = make([]byte, r.cfg.FingerprintBytes)
	}
	b := r.fpBuf[:len(f.fp)]
	if n, _ := f.f.ReadAt(b, 0); n < len(b) {
		// Unreadable now (an I/O error) or shorter than Stat said: not
		// evidence of new content; the next poll looks again.
		return false
	}
	return !bytes.Equal(b, f.fp) && !keptOffset(b, f.fp)
}

// keptOffset: a file's first bytes p, no longer its fingerprint fp, are
// zeros where fp's were not. A writer that did not open the file with
// O_APPEND (`app > app.log`) kept its offset across a copytruncate: the
// file is a hole up to that offset, its new lines after it. Read from byte
// 0 it would go to Kafka as NUL records; ferry reads on from its position,
// as before content was compared (docs/files.md).
func keptOffset(p, fp []byte) bool {
	n := min(len(p), len(fp))
	return n > 0 && allZero(p[:n]) && !allZero(fp[:n])
}

func allZero(p []byte) bool {
	for _, c := range p {
		if c != 0 {
			return false
		}
	}
	return true
}

// truncated restarts f at byte 0 with a new fingerprint; spans in flight
// of the old content no longer move its committed offset.
func (r *Receiver) truncated(f *file) {
	r.fm.truncations.WithLabelValues(r.cfg.Include[f.group]).Inc()
	r.mu.Lock()
	f.gen++
	clear(f.spans)
	f.spans = nil
	f.committed = 0
	f.rewind = false
	r.dropPendingLocked(f)
	r.dirty = true
	r.mu.Unlock()
	f.readOff, f.examined, f.inLong, f.held = 0, 0, false, false
	f.setFP(f.fp[:0])
	// New content: younger than its copy (adopted just before), whose
	// lines go first.
	f.born = r.nextBorn()
	f.retryAt = time.Time{}
}

// discover adds a file not known by its inode; false if it cannot be
// opened (tried again at the next poll).
func (r *Receiver) discover(path string, group int, id fileID, size int64, now time.Time) bool {
	var saved *entry
	first := path
	if e, ok := r.saved[id]; ok {
		saved = &e
		if e.Path != "" {
			first = e.Path
		}
	}
	f := r.adopt(first, path, group, id, size, now, saved)
	if f == nil {
		return false
	}
	f.seen = r.scanGen
	if saved != nil {
		r.mu.Lock()
		delete(r.saved, id)
		r.mu.Unlock()
	}
	return true
}

// adopt starts tracking the file at path: from the checkpoint's offset when
// the saved entry is this file (same first bytes), from its end when it is
// found at the very first start and start_at says so, else from byte 0.
func (r *Receiver) adopt(first, path string, group int, id fileID, size int64, now time.Time, saved *entry) *file {
	f := &file{id: id, path: first, cur: path, group: group, size: size}
	f.topic = r.topic.topic(first, r.host)
	if r.key != nil {
		f.key = []byte(r.key.expand(first, r.host))
	}
	f.pathV = []byte(first)
	for _, h := range r.headers {
		f.extra = append(f.extra, record.Header{Key: h.name, Value: []byte(h.t.expand(first, r.host))})
	}
	fd, err := os.Open(path)
	if err != nil {
		r.m.Error("open_error")
		r.log.Log(slog.LevelWarn, "open", "files: a file matched but cannot be opened", "path", path, "err", err)
		return nil
	}
	if fi, err := fd.Stat(); err != nil || !sameID(fi, id) {
		fd.Close() // replaced between the poll's stat and the open: the next poll sees it
		return nil
	}
	if f.gz = r.isGzip(path); f.gz {
		f.size = 0
		f.size = r.gzSize(f, fd, size)
		size = f.size
	} else {
		f.decided = true
	}
	off := int64(0)
	switch {
	case saved != nil:
		same := int64(saved.FPLen) <= size && matchesHash(fd, saved.FPLen, saved.FPHash)
		switch {
		case same && saved.Offset <= size:
			off = saved.Offset
		case same:
			// Shorter than its committed offset: truncated while ferry was
			// stopped. Otherwise its inode holds another file: byte 0.
			r.fm.truncations.WithLabelValues(r.cfg.Include[group]).Inc()
		}
	case r.firstScan && !r.hadCheckpoint && r.cfg.StartAt == "end":
		off = size
	}
	if saved != nil || off > 0 {
		f.decided = true
	}
	if saved != nil {
		f.born = saved.Born
	} else {
		f.born = r.nextBorn()
	}
	f.readOff, f.examined, f.committed = off, off, off
	if saved == nil {
		f.unsaved = true
		r.unsaved++
	}
	r.files[id] = f
	r.list = append(r.list, f)
	r.mu.Lock()
	r.dirty = true
	r.mu.Unlock()
	if r.open < r.cfg.MaxOpenFiles || r.evict(f) {
		f.f = fd
		f.used = r.tick
		r.open++
		r.fm.open.Set(float64(r.open))
		r.fillFP(f)
	} else {
		f.setFP(readPrefix(fd, r.cfg.FingerprintBytes, size))
		fd.Close()
	}
	return f
}

// nextBorn numbers a file found (or new content of one): higher than any
// before it, in this run or in the checkpoint.
func (r *Receiver) nextBorn() uint64 {
	r.born++
	return r.born
}

func sameID(fi os.FileInfo, id fileID) bool {
	got, ok := idOf(fi)
	return ok && got == id
}

// matchesHash: the file's first n bytes hash to h.
func matchesHash(fd *os.File, n int, h string) bool {
	buf := make([]byte, n)
	if _, err := fd.ReadAt(buf, 0); err != nil && !(err == io.EOF && n == 0) {
		return false
	}
	return fpHash(buf) == h
}

// readPrefix reads the first min(n, size) bytes.
func readPrefix(fd *os.File, n int, size int64) []byte {
	buf := make([]byte, min(int64(n), size))
	k, _ := fd.ReadAt(buf, 0)
	return buf[:k]
}

// setFP sets f's fingerprint and its hash.
func (f *file) setFP(p []byte) {
	f.fp = p
	f.fpH = fpHash(p)
}

// fillFP grows an open file's fingerprint while it is shorter than
// fingerprint_bytes and the file has more.
func (r *Receiver) fillFP(f *file) {
	if len(f.fp) >= r.cfg.FingerprintBytes || int64(len(f.fp)) >= f.size || f.f == nil || f.gz && len(f.fp) > 0 {
		return
	}
	p := readPrefix(f.f, r.cfg.FingerprintBytes, f.size)
	if keptOffset(p, f.fp) {
		return // the fingerprint stays what the writer wrote
	}
	if !bytes.HasPrefix(p, f.fp) {
		// Its first bytes changed under the same inode without it getting
		// shorter than what was read: new content.
		r.recoverCopy(f, time.Now())
		r.truncated(f)
	}
	f.setFP(p)
}

// ensureOpen opens f if it is closed, closing the least recently read file
// when max_open_files are open. A file whose first bytes are not its
// fingerprint any more (its inode reused) is read from its start.
func (r *Receiver) ensureOpen(f *file, now time.Time) bool {
	if f.f != nil {
		f.used = r.tick
		r.fillFP(f)
		return true
	}
	if f.cur == "" || (r.open >= r.cfg.MaxOpenFiles && !r.evict(f)) {
		return false
	}
	fd, err := os.Open(f.cur)
	if err != nil {
		r.m.Error("open_error")
		r.log.Log(slog.LevelWarn, "open", "files: a file cannot be opened", "path", f.cur, "err", err)
		f.retryAt = now.Add(r.cfg.PollInterval)
		return false
	}
	if fi, err := fd.Stat(); err != nil || !sameID(fi, f.id) {
		fd.Close()
		f.retryAt = now.Add(r.cfg.PollInterval)
		return false
	}
	if p := readPrefix(fd, len(f.fp), int64(len(f.fp))); len(f.fp) > 0 && !bytes.Equal(p, f.fp) && !keptOffset(p, f.fp) {
		r.recoverCopy(f, now)
		r.truncated(f)
	}
	f.f = fd
	f.used = r.tick
	r.open++
	r.fm.open.Set(float64(r.open))
	r.fillFP(f)
	return true
}

// evict closes the least recently read open file that is not an orphan
// (an orphan cannot be opened again) and not keep; false if there is none.
func (r *Receiver) evict(keep *file) bool {
	var victim *file
	for _, f := range r.list {
		if f.f != nil && f != keep && !f.orphan && (victim == nil || f.used < victim.used) {
			victim = f
		}
	}
	if victim == nil {
		return false
	}
	r.closeFile(victim)
	return true
}

func (r *Receiver) closeFile(f *file) {
	if f.f == nil {
		return
	}
	f.f.Close()
	f.f = nil
	f.zr = nil
	r.open--
	r.fm.open.Set(float64(r.open))
}

// findInDir looks in dir for the file with inode id (rotated to another
// name there).
func findInDir(dir string, id fileID) (path string, size int64, ok bool, err error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if sameID(fi, id) {
			return filepath.Join(dir, e.Name()), fi.Size(), true, nil
		}
	}
	return "", 0, false, nil
}

// gauges sets the per-group gauges: files known and bytes not committed.
func (r *Receiver) gauges() {
	watched := make([]int, len(r.cfg.Include))
	lag := make([]int64, len(r.cfg.Include))
	r.mu.Lock()
	for _, f := range r.list {
		if f.released {
			continue
		}
		watched[f.group]++
		lag[f.group] += max(f.size-f.committed, 0)
	}
	r.mu.Unlock()
	for g, pat := range r.cfg.Include {
		r.fm.watched.WithLabelValues(pat).Set(float64(watched[g]))
		r.fm.lag.WithLabelValues(pat).Set(float64(lag[g]))
	}
}
