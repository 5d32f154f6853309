package spool

// Recovery at Open: what the directory holds after a clean stop or a crash.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

func (s *Spool) recover() error {
	ids, spares, err := listDir(s.cfg.Dir)
	if err != nil {
		return err
	}
	cp, ok, err := readCheckpoint(s.path("checkpoint"))
	if err != nil {
		// Unreadable checkpoint: replay everything there is (duplicates,
		// never loss) and say so.
		s.logger.Warn("spool checkpoint unreadable; replaying every segment from its start", "err", err)
		s.m.corruptRegions.Inc()
		ok = false
	}
	if !ok && len(ids) > 0 {
		cp = pos{ids[0], 0}
	}
	kept := ids[:0]
	for _, id := range ids {
		if id < cp.seg {
			// Wholly acknowledged; its deletion was interrupted.
			_ = os.Remove(s.path(segName(id)))
			continue
		}
		kept = append(kept, id)
	}
	ids = kept
	var tail uint64
	hasTail := false
	lost := map[uint64]bool{}
	for i := 0; i < len(ids); i++ {
		id := ids[i]
		fi, err := os.Stat(s.path(segName(id)))
		if err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		size := fi.Size()
		if i == len(ids)-1 {
			if size, err = s.repairTail(id, size); err != nil {
				return err
			}
			if size < 0 {
				lost[id] = true
				ids = ids[:i]
				break
			}
			tail, hasTail = id, true
		}
		if f, err := readSegFormat(s.path(segName(id))); err == nil && !f.v1 {
			s.maxSegFrame = max(s.maxSegFrame, f.maxFrame)
		} else if err == nil {
			if s.v1 == nil {
				s.v1 = map[uint64]bool{}
			}
			s.v1[id] = true
		}
		s.segs[id] = size
		s.disk += size
	}
	if len(ids) > 0 && (cp.seg != ids[0] || cp.off < 0) {
		cp = pos{ids[0], 0}
	}
	next := cp.seg + 1
	if len(ids) > 0 {
		next = max(next, ids[len(ids)-1]+1)
	}
	for id := range lost {
		// Never reuse the id of a segment removed as unreadable: a place
		// in it (an idempotency key's, Kafka's committed position) must
		// never match bytes of another segment.
		next = max(next, id+1)
	}
	// The new segment is created by the first append, so that a full disk
	// does not stop ferry from starting and draining what is there.
	s.wseg, s.woff = next, segHeader
	if len(ids) == 0 {
		cp = pos{next, segHeader}
	}
	s.adoptSpares(spares)
	if s.idem != nil {
		low := next
		if len(ids) > 0 {
			low = ids[0]
		}
		if err := s.loadKeys(tail, hasTail, low, lost); err != nil {
			return err
		}
	}
	s.rpos, s.wm, s.ckpt = cp, cp, pos{}
	s.replayEnd = pos{next, segHeader}
	backlog := s.Backlog()
	s.m.backlogAtOpen.Set(float64(backlog))
	s.m.backlogAtOpenValue = backlog
	s.logger.Info("spool opened", "dir", s.cfg.Dir, "segments", len(ids), "backlog_bytes", backlog,
		"fsync", s.cfg.Fsync, "max_bytes", s.cfg.MaxBytes.String())
	if err := s.writeCheckpoint(cp); err != nil {
		s.logger.Warn("spool checkpoint not written at start (a restart would replay more)", "err", err)
	}
	return nil
}

// repairTail scans the newest segment of a previous run and truncates what
// follows its last valid frame (the write a crash cut short). It returns the
// new size, or -1 if the file held no segment at all and was removed.
func (s *Spool) repairTail(id uint64, size int64) (int64, error) {
	name := s.path(segName(id))
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("spool: %w", err)
	}
	defer f.Close()
	var hdr [segHeader]byte
	hn, _ := f.ReadAt(hdr[:], 0)
	sf, herr := parseSegHeader(hdr[:hn])
	if herr != nil {
		s.m.corruptBytes.WithLabelValues("truncated").Add(float64(size))
		s.m.corruptRegions.Inc()
		s.logger.Warn("spool segment without a valid header removed", "segment", filepath.Base(name), "bytes", size)
		f.Close()
		return -1, os.Remove(name)
	}
	if sf.v1 {
		sf.maxFrame = s.v1MaxFrame()
	}
	validEnd := sf.dataStart()
	err = walkFrames(f, size, sf.dataStart(), sf, s.chunk, func(off int64, p []byte) bool {
		validEnd = off + int64(sf.hdrLen()) + int64(len(p))
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("spool: reading %s: %w", name, err)
	}
	if validEnd < size {
		torn := size - validEnd
		if err := f.Truncate(validEnd); err != nil {
			return 0, fmt.Errorf("spool: truncating the torn tail of %s: %w", name, err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("spool: %w", err)
		}
		if sf.recycled {
			// What follows the last frame of a recycled file is mostly its
			// previous segment's bytes, which no frame of this one can
			// match (a torn write, if any, is among them): not damage.
			s.logger.Info("spool: recycled segment cut at its last frame", "segment", filepath.Base(name),
				"bytes", torn, "kept_bytes", validEnd)
			return validEnd, nil
		}
		s.m.corruptBytes.WithLabelValues("truncated").Add(float64(torn))
		s.m.corruptRegions.Inc()
		s.logger.Warn("spool: torn tail truncated", "segment", filepath.Base(name), "bytes", torn, "kept_bytes", validEnd)
	}
	return validEnd, nil
}

// readSegFormat reads the header of segment file name.
func readSegFormat(name string) (*segFormat, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hdr [segHeader]byte
	n, _ := f.ReadAt(hdr[:], 0)
	return parseSegHeader(hdr[:n])
}

// v1MaxFrame bounds the frames of an old segment, which recorded no limit:
// the current limit or the old default, whichever is larger.
func (s *Spool) v1MaxFrame() int { return max(s.maxFrame, 8<<20+4096) }

// listDir lists a spool directory: the segments' ids in order and the
// spares' names. Nothing else in it is the spool's.
func listDir(dir string) (ids []uint64, spares []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("spool: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".spare") {
			spares = append(spares, e.Name())
			continue
		}
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok {
			continue
		}
		id, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, spares, nil
}

// walkFrames calls fn with every valid frame of the sealed segment in f
// (size bytes, frames sealed for sf) from start on, with its offset in the
// file, reading chunk bytes at a time (more for a larger frame); fn
// returning false stops the walk. Damage is skipped as the reader skips it
// (scan): a current segment resynchronises at the next valid frame, an old
// (v1) one ends at its first damage. Recovery's tail repair and the
// read-only tools (inspect.go) walk segments with it.
func walkFrames(f io.ReaderAt, size, start int64, sf *segFormat, chunk int, fn func(off int64, payload []byte) bool) error {
	buf := make([]byte, chunk)
	need := 0
	for off := start; off < size; {
		want := min(int64(max(len(buf), need)), size-off)
		if int64(cap(buf)) < want {
			buf = make([]byte, want)
		}
		n, err := f.ReadAt(buf[:want], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		// A file shorter than its recorded size ends where it ends.
		atEnd := off+int64(n) >= size || int64(n) < want
		stopped := false
		stop, nd, skipped, _ := scan(buf[:n], atEnd, sf, func(o int, p []byte) bool {
			if !fn(off+int64(o), p) {
				stopped = true
				return false
			}
			return true
		})
		need = nd
		if stopped || atEnd || sf.v1 && skipped > 0 {
			// An old segment cannot be resynchronised: the reader ends it
			// at its first damage.
			return nil
		}
		if stop == 0 && need == 0 {
			stop = 1
		}
		off += int64(stop)
	}
	return nil
}
