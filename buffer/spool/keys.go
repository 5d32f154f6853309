package spool

// The key log: idempotency keys (package idempotency), durable with the
// records they were sent with. See the package doc, "Idempotency keys".

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/record"
)

const (
	keyMagic = "FRYKEY01"
	// keyFixed: version, time, segment, offset, length, region CRC,
	// records, fingerprint.
	keyFixed     = 1 + 8 + 8 + 8 + 4 + 4 + 4 + 16
	keyFrameHdr  = 8 // u32 body length | u32 CRC32C(body)
	keyVersion   = 1
	keyMaxBody   = keyFixed + idempotency.MaxScopedBytes
	keyFilesKept = 64 // a bound on sealed files whatever the clock does
)

// keyRec is one entry of the key log: the scoped key, the request's
// fingerprint and answer, and where its records are in the spool (the
// region one append wrote, with the CRC32C of its bytes as written).
type keyRec struct {
	at      int64 // unix ns
	seg     uint64
	off     int64
	length  uint32
	crc     uint32
	records uint32
	sum     [16]byte
	key     []byte
}

var errKeyFrame = errors.New("spool: damaged or torn key log entry")

// appendKeyRec appends r as one key-log frame.
func appendKeyRec(dst []byte, r *keyRec) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, keyVersion)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.at))
	dst = binary.LittleEndian.AppendUint64(dst, r.seg)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.off))
	dst = binary.LittleEndian.AppendUint32(dst, r.length)
	dst = binary.LittleEndian.AppendUint32(dst, r.crc)
	dst = binary.LittleEndian.AppendUint32(dst, r.records)
	dst = append(dst, r.sum[:]...)
	dst = append(dst, r.key...)
	body := dst[start+keyFrameHdr:]
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(dst[start+4:], crc32c(body))
	return dst
}

// decodeKeyRec decodes the frame at the start of b; n is its length. The
// key aliases b. Any damage (a short or torn frame, a bad checksum, a
// length out of bounds, an unknown version) is errKeyFrame.
func decodeKeyRec(b []byte) (r keyRec, n int, err error) {
	if len(b) < keyFrameHdr {
		return r, 0, errKeyFrame
	}
	ln := binary.LittleEndian.Uint32(b)
	if ln <= keyFixed || ln > keyMaxBody || int64(ln) > int64(len(b)-keyFrameHdr) {
		return r, 0, errKeyFrame
	}
	body := b[keyFrameHdr : keyFrameHdr+int(ln)]
	if crc32c(body) != binary.LittleEndian.Uint32(b[4:]) || body[0] != keyVersion {
		return r, 0, errKeyFrame
	}
	r.at = int64(binary.LittleEndian.Uint64(body[1:]))
	r.seg = binary.LittleEndian.Uint64(body[9:])
	r.off = int64(binary.LittleEndian.Uint64(body[17:]))
	r.length = binary.LittleEndian.Uint32(body[25:])
	r.crc = binary.LittleEndian.Uint32(body[29:])
	r.records = binary.LittleEndian.Uint32(body[33:])
	copy(r.sum[:], body[37:53])
	r.key = body[keyFixed:]
	if r.off < 0 || r.length == 0 {
		return keyRec{}, 0, errKeyFrame
	}
	return r, keyFrameHdr + int(ln), nil
}

func keyFileName(id uint64) string { return fmt.Sprintf("dedup-%020d.log", id) }

type keyFile struct {
	id     uint64
	size   int64
	newest int64 // unix ns of its newest entry
}

// keyLog is the appender's part that writes the key log; s.mu guards it.
type keyLog struct {
	kf     *os.File // the active key file; nil until the first keyed append
	kid    uint64   // the active (or next) file's id
	koff   int64
	kborn  time.Time
	knew   int64 // newest entry in the active file
	kdirty bool  // written since its last fsync
	kfiles []keyFile
	kbuf   []byte
}

// writeKey writes b's key, for the records buf is about to write at at,
// to the key log: before the records, under the same append lock, so any
// later fsync of the segment is preceded by the key log's (see the doc).
// On failure nothing of the entry remains and the append is refused.
// Called with s.mu held.
func (s *Spool) writeKey(b *record.Batch, buf []byte, crc uint32, at pos) (undo func(), err error) {
	now := time.Now()
	if s.kf != nil && (s.koff > int64(s.idem.Config().MaxBytes)/4 || now.Sub(s.kborn) > s.idem.Config().Window/4) {
		s.sealKeys()
	}
	if s.kf == nil {
		if err := s.createKeys(now); err != nil {
			return nil, err
		}
	}
	// Every key of the batch names the same region: each is durable if and
	// only if the whole append is.
	s.kbuf = s.kbuf[:0]
	for id := b.Idem; id != nil; id = id.Next {
		records := id.Records
		if records == 0 {
			records = len(b.Records)
		}
		r := keyRec{at: now.UnixNano(), seg: at.seg, off: at.off, length: uint32(len(buf)), crc: crc,
			records: uint32(records), sum: id.Sum, key: id.Key}
		s.kbuf = appendKeyRec(s.kbuf, &r)
	}
	defer func() {
		// One request's keys (a Kafka produce request may carry thousands)
		// are not kept as the buffer's capacity for every later append.
		if cap(s.kbuf) > 64<<10 {
			s.kbuf = nil
		}
	}()
	if _, err := s.kf.WriteAt(s.kbuf, s.koff); err != nil {
		if terr := s.kf.Truncate(s.koff); terr != nil {
			s.failErr = fmt.Errorf("key log write failed (%v) and truncating it failed: %w", err, terr)
		}
		return nil, err
	}
	was := s.koff
	s.koff += int64(len(s.kbuf))
	s.knew = now.UnixNano()
	s.kdirty = true
	return func() {
		// The records' write failed: the entry goes too (were it kept,
		// recovery would still drop it, its region's CRC not matching).
		if s.kf.Truncate(was) == nil {
			s.koff = was
		}
	}, nil
}

// createKeys starts the next key file. Called with s.mu held.
func (s *Spool) createKeys(now time.Time) error {
	f, err := os.OpenFile(s.path(keyFileName(s.kid)), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(keyMagic), 0); err != nil {
		f.Close()
		_ = os.Remove(f.Name())
		return err
	}
	if s.cfg.Fsync != "never" {
		syncDir(s.cfg.Dir)
	}
	s.kf, s.koff, s.kborn, s.knew, s.kdirty = f, int64(len(keyMagic)), now, 0, true
	return nil
}

// sealKeys closes the active key file (fsynced unless fsync is never) and
// forgets the sealed files past the window or the bytes. Called with s.mu
// held.
func (s *Spool) sealKeys() {
	s.syncMu.Lock()
	var err error
	if s.cfg.Fsync != "never" {
		// Always, not only when dirty: the syncer clears the flag before
		// its fsync, and finding this file closed it counts on this one.
		err = s.fsync(s.kf)
	}
	s.kf.Close()
	s.syncMu.Unlock()
	if err != nil && s.failErr == nil {
		s.failErr = fmt.Errorf("sealing the key log: %w", err)
	}
	s.kfiles = append(s.kfiles, keyFile{id: s.kid, size: s.koff, newest: s.knew})
	s.kf, s.kdirty = nil, false
	s.kid++
	s.pruneKeys(time.Now())
}

// pruneKeys deletes the sealed key files whose entries are all past the
// window, and the oldest while the sealed files hold more than max_bytes
// (a restart then remembers what the store remembered: it evicts by the
// same bytes, oldest first).
func (s *Spool) pruneKeys(now time.Time) {
	cfg := s.idem.Config()
	var total int64
	for _, f := range s.kfiles {
		total += f.size
	}
	i := 0
	for i < len(s.kfiles) {
		f := s.kfiles[i]
		if now.UnixNano()-f.newest <= int64(cfg.Window) && total <= int64(cfg.MaxBytes) && len(s.kfiles)-i <= keyFilesKept {
			break
		}
		_ = os.Remove(s.path(keyFileName(f.id)))
		total -= f.size
		i++
	}
	s.kfiles = slices.Delete(s.kfiles, 0, i)
}

// keyRegionCRC is the CRC32C of an append's bytes as written.
// rewriteKeys replaces a key file with b, atomically: a temporary file,
// fsynced, renamed over it, the directory fsynced.
func (s *Spool) rewriteKeys(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("spool: rewriting the key log: %w", err)
	}
	if s.cfg.Fsync != "never" {
		f, err := os.Open(tmp)
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		if err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("spool: rewriting the key log: %w", err)
		}
	}
	if err := os.Rename(tmp, name); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("spool: rewriting the key log: %w", err)
	}
	syncDir(s.cfg.Dir)
	return nil
}

func keyRegionCRC(buf []byte) uint32 { return crc32.Checksum(buf, castagnoli) }

// loadKeys reads the key log at Open and gives the store every key whose
// records are durable: those in a segment still on disk at the place the
// entry names (in tail, the newest segment of the previous run — the only
// one a crash can have cut short — only if the bytes there are the ones
// written), and those in a segment already retired (its records were
// acknowledged by Kafka, so they were durable). A key whose records are
// not (a torn append, a segment removed as damaged) is dropped: the
// client's retry is then accepted, as it must be. low is the first
// segment kept (or the next to write), lost the segments recovery removed
// as unreadable.
func (s *Spool) loadKeys(tail uint64, hasTail bool, low uint64, lost map[uint64]bool) error {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	var ids []uint64
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "dedup-")
		if !ok {
			continue
		}
		if name, ok = strings.CutSuffix(name, ".log"); !ok {
			continue
		}
		if id, err := strconv.ParseUint(name, 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var tf *os.File
	if hasTail {
		if tf, err = os.Open(s.path(segName(tail))); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		defer tf.Close()
	}
	var region []byte
	valid := func(r *keyRec) bool {
		if size, ok := s.segs[r.seg]; ok {
			end := r.off + int64(r.length)
			if r.off < segHeaderV1 || end > size {
				return false
			}
			if hasTail && r.seg == tail {
				region = slices.Grow(region[:0], int(r.length))[:r.length]
				if _, err := tf.ReadAt(region, r.off); err != nil && !errors.Is(err, io.EOF) {
					return false
				}
				return keyRegionCRC(region) == r.crc
			}
			return true
		}
		return r.seg < low && !lost[r.seg]
	}
	restored, dropped := 0, 0
	maxBytes := int64(s.idem.Config().MaxBytes)
	for _, id := range ids {
		name := s.path(keyFileName(id))
		fi, err := os.Stat(name)
		if err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		if fi.Size() > 2*maxBytes+keyMaxBody+int64(len(keyMagic)) {
			// Not written under these bounds (or not ours): its keys are
			// forgotten, never read whole into memory.
			s.logger.Warn("spool: key log file larger than delivery.idempotency.max_bytes allows; its keys are forgotten",
				"file", keyFileName(id), "bytes", fi.Size())
			_ = os.Remove(name)
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		if len(b) < len(keyMagic) || string(b[:len(keyMagic)]) != keyMagic {
			s.m.corruptRegions.Inc()
			_ = os.Remove(name)
			continue
		}
		var newest int64
		// keep: the file's entries that passed, rewritten over it when any
		// did not: a dropped entry must stay dropped. Left in the file, a
		// later Open would check it by bounds only (its segment no longer
		// the newest) and bring back a key whose records are gone.
		keep := []byte(keyMagic)
		changed := false
		for off := len(keyMagic); off < len(b); {
			r, n, err := decodeKeyRec(b[off:])
			if err != nil {
				// A torn tail, or damage: the rest of this file is not
				// trusted (those retries are accepted again: duplicates,
				// never loss).
				s.m.corruptBytes.WithLabelValues("truncated").Add(float64(len(b) - off))
				s.m.corruptRegions.Inc()
				changed = true
				break
			}
			off += n
			if !valid(&r) {
				dropped++
				changed = true
				continue
			}
			keep = appendKeyRec(keep, &r)
			newest = max(newest, r.at)
			s.idem.Restore(r.key, r.sum, int(r.records), time.Unix(0, r.at))
			restored++
		}
		size := int64(len(b))
		if changed {
			if err := s.rewriteKeys(name, keep); err != nil {
				return err
			}
			size = int64(len(keep))
		}
		s.kfiles = append(s.kfiles, keyFile{id: id, size: size, newest: newest})
		s.kid = id + 1
	}
	s.pruneKeys(time.Now())
	if restored+dropped > 0 {
		s.logger.Info("spool: idempotency keys recovered", "keys", restored, "dropped_without_records", dropped)
	}
	return nil
}
