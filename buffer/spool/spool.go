package spool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// DeadLetter stores a record that Kafka refused for good, with the reason.
// It calls done exactly once: nil when the record is durable where it went
// (fsynced in the file, or acknowledged by Kafka in the dead-letter topic),
// else the error. r's memory stays valid until done. The spool's watermark
// does not pass the record before done(nil), so a crash in between replays
// it instead of losing it from spool, topic and file alike.
type DeadLetter interface {
	Write(r *record.Record, reason string, cause error, done func(error))
}

// Links connects a spool to the rest of the pipeline; they are given to
// Open, so Start only starts.
type Links struct {
	// Next receives what the reader reads (the exporter). Required.
	Next consumer.Consumer
	// MaxRecordBytes is the largest record Next takes (the exporter's
	// max_batch_bytes): the frame bound this process writes segments
	// under; 0 means 8 MiB.
	MaxRecordBytes int
	// Budget: the memory the reader takes its chunks from, shared with the
	// queue and the receivers; nil means an unbounded one (the read_ahead
	// ceiling still applies).
	Budget *budget.Budget
	// DeadLetter takes records Kafka refuses for good. Nil: they are
	// retried like any other failure (nothing leaves unacknowledged).
	DeadLetter DeadLetter
	// Up reports whether Kafka is reachable (refusals: 429 if so, else 503).
	Up func() bool
}

func (l Links) withDefaults() (Links, error) {
	if l.Next == nil {
		return l, errors.New("spool: Links.Next is required")
	}
	if l.Up == nil {
		l.Up = func() bool { return true }
	}
	if l.Budget == nil {
		l.Budget = budget.New(math.MaxInt64)
	}
	return l, nil
}

type pos struct {
	seg uint64
	off int64
}

func (a pos) less(b pos) bool { return a.seg < b.seg || a.seg == b.seg && a.off < b.off }

type waiter struct {
	end int64
	b   *record.Batch
	n   int64
}

// Spool is an open spool directory.
type Spool struct {
	cfg      Config
	maxFrame int
	// wfmt seals the frames this process writes; maxSegFrame is the
	// largest frame limit recorded in any segment found at Open (the reader
	// must be able to hold one such frame, whatever the config says now).
	wfmt        *segFormat
	maxSegFrame int
	log         *telemetry.Limited
	logger      *slog.Logger
	m           *metrics
	lockFile    *os.File
	ckptFile    *os.File
	links       Links
	budget      *budget.Budget
	ceiling     int64
	chunk       int

	mu      sync.Mutex
	f       *os.File
	wseg    uint64
	woff    int64
	written int64
	segs    map[uint64]int64 // bytes of every segment on disk, the active one included
	disk    int64
	failErr error // sticky: a failed fsync or segment roll
	durable int64 // written bytes a segment roll's fsync has made durable
	// fsync is (*os.File).Sync; tests replace it to fail.
	fsync   func(*os.File) error
	closing bool

	appending atomic.Int64
	bufPool   sync.Pool

	syncMu   sync.Mutex // held around fsync, and by roll while it closes a file
	waitMu   sync.Mutex
	waiters  []waiter
	syncKick chan struct{}

	dataKick chan struct{}
	freeKick chan struct{}

	// The finisher's queue (see finisher).
	finMu   sync.Mutex
	finQ    []finTask
	finKick chan struct{}
	stopFin chan struct{}
	finWG   sync.WaitGroup

	ackMu sync.Mutex
	fifo  []*mark
	wm    pos // every record before wm is acknowledged
	ckpt  pos // wm as last written to the checkpoint

	replayDone bool
	startedAt  time.Time

	// Reader state, owned by the reader goroutine.
	rpos      pos
	rf        *os.File
	rfSeg     uint64
	rfFmt     *segFormat
	replayEnd pos
	dec       decoder
	need      int
	lingered  bool
	chunks    sync.Pool
	tokens    float64
	tokensAt  time.Time

	stopRead  chan struct{}
	stopSync  chan struct{}
	readStop  atomic.Bool
	readWG    sync.WaitGroup
	syncWG    sync.WaitGroup
	started   bool
	closeOnce sync.Once
}

// Open opens (or creates) the spool in cfg.Dir and recovers its state:
// acknowledged segments are deleted, a torn tail is truncated, and reading
// will resume at the checkpoint. Nothing is read into memory beyond one
// chunk at a time.
func Open(cfg Config, set telemetry.Settings, l Links) (*Spool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l, err := l.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Spool{cfg: cfg, links: l, budget: l.Budget, segs: map[uint64]int64{}, syncKick: make(chan struct{}, 1),
		dataKick: make(chan struct{}, 1), freeKick: make(chan struct{}, 1),
		stopRead: make(chan struct{}), stopSync: make(chan struct{}), chunk: 1 << 20, fsync: (*os.File).Sync,
		finKick: make(chan struct{}, 1), stopFin: make(chan struct{})}
	s.maxFrame = l.MaxRecordBytes + 4096
	if l.MaxRecordBytes <= 0 {
		s.maxFrame = 8 << 20
	}
	wf, err := newSegFormat(s.maxFrame)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s.wfmt, s.maxSegFrame = wf, s.maxFrame
	s.logger = set.Logger.With("component", "buffer/spool")
	s.log = telemetry.NewLimited(s.logger, 30*time.Second)
	s.m = newMetrics(set.Registry, s)
	s.chunks.New = func() any { c := &chunk{s: s}; c.doneFn = c.onDone; c.failFn = c.onFailure; return c }
	// The directory and its files are the agent's alone: the records are
	// other applications' data, and a segment's header holds the secret
	// its frames are sealed with.
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(cfg.Dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lf.Close()
		return nil, fmt.Errorf("spool: %s is in use by another ferry process (%v)", cfg.Dir, err)
	}
	s.lockFile = lf
	if err := s.recover(); err != nil {
		s.lockFile.Close()
		return nil, err
	}
	set.Health.Register("spool", s.ready)
	return s, nil
}

func segName(id uint64) string { return fmt.Sprintf("%020d.seg", id) }

func (s *Spool) path(name string) string { return filepath.Join(s.cfg.Dir, name) }

func (s *Spool) recover() error {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	var ids []uint64
	for _, e := range entries {
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
				ids = ids[:i]
				break
			}
		}
		if f, err := readSegFormat(s.path(segName(id))); err == nil && !f.v1 {
			s.maxSegFrame = max(s.maxSegFrame, f.maxFrame)
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
	// The new segment is created by the first append, so that a full disk
	// does not stop ferry from starting and draining what is there.
	s.wseg, s.woff = next, segHeader
	if len(ids) == 0 {
		cp = pos{next, segHeader}
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
	buf := make([]byte, s.chunk)
	for off := sf.dataStart(); off < size; {
		want := min(int64(max(len(buf), s.need)), size-off)
		if int64(cap(buf)) < want {
			buf = make([]byte, want)
		}
		n, err := f.ReadAt(buf[:want], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("spool: reading %s: %w", name, err)
		}
		atEnd := off+int64(n) >= size
		stop, need, _, _ := scan(buf[:n], atEnd, sf, func(o int, p []byte) bool {
			validEnd = off + int64(o) + int64(sf.hdrLen()) + int64(len(p))
			return true
		})
		s.need = need
		if stop == 0 && need == 0 && !atEnd {
			stop = 1
		}
		off += int64(stop)
		if atEnd {
			break
		}
	}
	s.need = 0
	if validEnd < size {
		torn := size - validEnd
		if err := f.Truncate(validEnd); err != nil {
			return 0, fmt.Errorf("spool: truncating the torn tail of %s: %w", name, err)
		}
		if err := f.Sync(); err != nil {
			return 0, fmt.Errorf("spool: %w", err)
		}
		s.m.corruptBytes.WithLabelValues("truncated").Add(float64(torn))
		s.m.corruptRegions.Inc()
		s.logger.Warn("spool: torn tail truncated", "segment", filepath.Base(name), "bytes", torn, "kept_bytes", validEnd)
	}
	return validEnd, nil
}

// create makes segment s.wseg's file, the active one. Called with s.mu held.
// A failure leaves no file behind and may be retried by the next append.
func (s *Spool) create() error {
	id := s.wseg
	f, err := os.OpenFile(s.path(segName(id)), os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.WriteAt(s.wfmt.header(), 0); err == nil && s.cfg.Fsync != "never" {
		err = f.Sync()
	}
	if err != nil {
		f.Close()
		_ = os.Remove(f.Name())
		return err
	}
	if s.cfg.Fsync != "never" {
		syncDir(s.cfg.Dir)
	}
	s.f, s.woff = f, segHeader
	s.segs[id] = segHeader
	s.disk += segHeader
	return nil
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

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// Start begins delivering: the reader, the finisher, the syncer and the
// checkpointer.
func (s *Spool) Start(context.Context) error {
	s.ceiling = max(int64(s.cfg.ReadAhead), int64(2*s.maxSegFrame))
	s.ceiling = min(s.ceiling, s.budget.Limit())
	s.chunk = int(min(1<<20, max(64<<10, s.ceiling/4)))
	s.started = true
	s.startedAt = time.Now()
	s.readWG.Add(1)
	go s.read()
	s.finWG.Add(1)
	go s.finisher()
	s.syncWG.Add(2)
	go s.syncer()
	go s.checkpointer()
	return nil
}

// errWrite is a failed write to the spool; the client may retry.
func errWrite(err error) error {
	reason := "spool_write_error"
	if errors.Is(err, syscall.ENOSPC) {
		reason = "spool_disk_full"
	}
	return &consumer.RetryableError{Reason: reason, After: 5 * time.Second,
		Msg: "ferry could not write to its disk spool: " + osCause(err)}
}

// osCause is what a client may see of an OS error: the condition ("no
// space left on device"), never the file names and paths around it, which
// are the host's business (the log has them).
func osCause(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	if errors.Is(err, os.ErrClosed) {
		return "file closed"
	}
	return "I/O error"
}

// Consume appends b and completes it under the fsync policy. It never
// blocks on fsync: with fsync always the completion runs from the syncer.
func (s *Spool) Consume(_ context.Context, b *record.Batch) error {
	n := len(b.Records)
	if n == 0 {
		b.Complete(nil)
		return nil
	}
	buf := s.getBuf()
	for i := range b.Records {
		r := &b.Records[i]
		before := len(buf)
		buf = appendFrame(buf, r, s.wfmt)
		if len(buf)-before-frameHeader > s.maxFrame {
			s.putBuf(buf)
			s.m.refused.WithLabelValues("record_too_large").Add(float64(n))
			return consumer.TooLarge("record", int64(r.Size()), int64(s.maxFrame), nil)
		}
	}
	size := int64(len(buf))
	if s.appending.Add(size) > int64(s.cfg.WriteBuffer) && s.appending.Load() != size {
		s.appending.Add(-size)
		s.putBuf(buf)
		s.m.refused.WithLabelValues("write_buffer_full").Add(float64(n))
		return consumer.ErrFull
	}
	s.mu.Lock()
	err := s.appendLocked(buf, b, size)
	s.mu.Unlock()
	s.putBuf(buf)
	if err != nil {
		s.appending.Add(-size)
		s.m.refused.WithLabelValues(consumer.Reason(err)).Add(float64(n))
		return err
	}
	s.m.appendedRecords.Add(float64(n))
	s.m.appendedBytes.Add(float64(size))
	kick(s.dataKick)
	if s.cfg.Fsync == "always" {
		kick(s.syncKick)
		return nil
	}
	s.appending.Add(-size)
	b.Complete(nil)
	return nil
}

func (s *Spool) appendLocked(buf []byte, b *record.Batch, size int64) error {
	switch {
	case s.closing:
		return consumer.ErrShuttingDown
	case s.failErr != nil:
		return &consumer.RetryableError{Reason: "spool_failed", After: 30 * time.Second,
			Msg: "ferry's disk spool failed and accepts nothing until restarted: " + osCause(s.failErr)}
	case s.disk+size > int64(s.cfg.MaxBytes):
		if !s.links.Up() {
			return &consumer.RetryableError{Reason: "spool_full", After: 5 * time.Second,
				Msg: "Kafka is unreachable and ferry's disk spool is full; retry later"}
		}
		return consumer.ErrSpoolFull
	}
	if s.f != nil && s.woff+size > int64(s.cfg.SegmentBytes) && s.woff > segHeader {
		if err := s.roll(); err != nil {
			return err
		}
	}
	if s.f == nil {
		if err := s.create(); err != nil {
			s.m.writeErrors.Inc()
			s.log.Log(slog.LevelError, "create", "spool segment not created; the request is refused", "err", err)
			return errWrite(err)
		}
	}
	if _, err := s.f.WriteAt(buf, s.woff); err != nil {
		// Leave no partial frame behind: the next append starts at woff.
		s.m.writeErrors.Inc()
		s.log.Log(slog.LevelError, "write", "spool write failed; the request is refused", "err", err)
		if terr := s.f.Truncate(s.woff); terr != nil {
			s.failErr = fmt.Errorf("write failed (%v) and truncating it failed: %w", err, terr)
		}
		return errWrite(err)
	}
	s.woff += size
	s.written += size
	s.segs[s.wseg] = s.woff
	s.disk += size
	if s.cfg.Fsync == "always" {
		s.waitMu.Lock()
		s.waiters = append(s.waiters, waiter{end: s.written, b: b, n: size})
		s.waitMu.Unlock()
	}
	return nil
}

// roll seals the active segment (fsynced unless fsync is never) and starts
// the next. Called with s.mu held.
func (s *Spool) roll() error {
	s.syncMu.Lock()
	var err error
	if s.cfg.Fsync != "never" {
		err = s.fsync(s.f)
	}
	s.f.Close()
	s.f = nil
	s.syncMu.Unlock()
	// Whatever the outcome, the appends waiting for an fsync of the sealed
	// segment learn it now, not at the next append (which may never come).
	defer kick(s.syncKick)
	if err != nil {
		s.failErr = fmt.Errorf("fsync of a full segment: %w", err)
		return errWrite(err)
	}
	s.durable = s.written
	s.wseg++
	s.woff = segHeader
	return nil
}

func (s *Spool) getBuf() []byte {
	if p, ok := s.bufPool.Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, 64<<10)
}

func (s *Spool) putBuf(b []byte) {
	if cap(b) > 4<<20 {
		return
	}
	s.bufPool.Put(&b)
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// syncer runs the fsync policy: group commit for always, a ticker for
// interval. It also makes the final fsync at shutdown in every mode.
func (s *Spool) syncer() {
	defer s.syncWG.Done()
	var tick <-chan time.Time
	if s.cfg.Fsync == "interval" {
		t := time.NewTicker(s.cfg.FsyncInterval)
		defer t.Stop()
		tick = t.C
	}
	var synced int64
	for {
		final := false
		select {
		case <-s.syncKick:
		case <-tick:
		case <-s.stopSync:
			final = true
		}
		s.mu.Lock()
		target, f, failed := s.written, s.f, s.failErr
		synced = max(synced, s.durable)
		s.mu.Unlock()
		if target > synced && f != nil && failed == nil && (s.cfg.Fsync != "never" || final) {
			start := time.Now()
			s.syncMu.Lock()
			err := s.fsync(f)
			s.syncMu.Unlock()
			if errors.Is(err, os.ErrClosed) {
				// A roll closed the file; its own fsync decided for what we
				// wanted: durable, or the spool has failed.
				s.mu.Lock()
				target, failed = max(synced, s.durable), s.failErr
				s.mu.Unlock()
				err = nil
			}
			s.m.fsyncs.Inc()
			s.m.fsyncSeconds.Observe(time.Since(start).Seconds())
			if err != nil {
				s.mu.Lock()
				if s.failErr == nil {
					s.failErr = fmt.Errorf("fsync: %w", err)
				}
				failed = s.failErr
				s.mu.Unlock()
				s.logger.Error("spool fsync failed; the spool refuses new data until ferry is restarted", "err", err)
			} else {
				synced = target
			}
		}
		s.completeWaiters(synced, failed)
		if final {
			return
		}
	}
}

// completeWaiters answers every append covered by an fsync up to synced,
// or every waiting append with failed.
func (s *Spool) completeWaiters(synced int64, failed error) {
	s.waitMu.Lock()
	i := 0
	for i < len(s.waiters) && (failed != nil || s.waiters[i].end <= synced) {
		i++
	}
	done := slices.Clone(s.waiters[:i])
	s.waiters = append(s.waiters[:0], s.waiters[i:]...)
	s.waitMu.Unlock()
	for _, w := range done {
		var err error
		if w.end > synced {
			err = errWrite(failed)
		}
		s.appending.Add(-w.n)
		w.b.Complete(err)
	}
}

// checkpointer writes the watermark once a second when it moved.
func (s *Spool) checkpointer() {
	defer s.syncWG.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stopSync:
			return
		case <-t.C:
		}
		s.ackMu.Lock()
		wm, ck := s.wm, s.ckpt
		s.ackMu.Unlock()
		if wm != ck {
			if err := s.writeCheckpoint(wm); err != nil {
				s.log.Log(slog.LevelError, "checkpoint", "spool checkpoint not written; a restart would replay more", "err", err)
			}
		}
	}
}

const ckptMagic = "FRYCKPT1"

// writeCheckpoint overwrites the checkpoint in place: 28 bytes in one
// sector, into blocks allocated once, so it works on a full disk where a
// temp file and rename would not. A torn write fails the CRC and recovery
// replays from the first segment: duplicates, never loss.
func (s *Spool) writeCheckpoint(p pos) error {
	var b [28]byte
	copy(b[:], ckptMagic)
	binary.LittleEndian.PutUint64(b[8:], p.seg)
	binary.LittleEndian.PutUint64(b[16:], uint64(p.off))
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	if s.ckptFile == nil {
		f, err := os.OpenFile(s.path("checkpoint"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return err
		}
		s.ckptFile = f
	}
	_, err := s.ckptFile.WriteAt(b[:], 0)
	if err == nil && s.cfg.Fsync != "never" {
		err = s.ckptFile.Sync()
	}
	if err != nil {
		return err
	}
	s.ackMu.Lock()
	s.ckpt = p
	s.ackMu.Unlock()
	return nil
}

func readCheckpoint(name string) (pos, bool, error) {
	b, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return pos{}, false, nil
	}
	if err != nil {
		return pos{}, false, err
	}
	if len(b) != 28 || string(b[:8]) != ckptMagic || crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:]) {
		return pos{}, false, errors.New("checkpoint: bad magic, size or checksum")
	}
	return pos{binary.LittleEndian.Uint64(b[8:]), int64(binary.LittleEndian.Uint64(b[16:]))}, true, nil
}

func (s *Spool) ready() error {
	s.mu.Lock()
	disk, failed := s.disk, s.failErr
	s.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("spool failed: %v", failed)
	}
	if disk >= int64(s.cfg.MaxBytes)*95/100 {
		return fmt.Errorf("spool %d%% full (%d of %d bytes)", disk*100/int64(s.cfg.MaxBytes), disk, int64(s.cfg.MaxBytes))
	}
	return nil
}

// DiskBytes is every segment byte on disk.
func (s *Spool) DiskBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.disk
}

// Backlog is the bytes appended and not yet acknowledged by Kafka.
func (s *Spool) Backlog() int64 {
	s.ackMu.Lock()
	wm := s.wm
	s.ackMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for id, size := range s.segs {
		switch {
		case id == wm.seg:
			n += max(0, size-max(wm.off, segHeader))
		case id > wm.seg:
			n += size - segHeader
		}
	}
	return n
}

// Shutdown stops taking data (fsyncing what was appended and answering
// its clients) and stops reading. Batches already handed to the exporter
// complete as it flushes; Close then records how far Kafka got.
func (s *Spool) Shutdown(context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.readStop.Store(true)
	if s.started {
		close(s.stopRead)
		s.readWG.Wait()
	}
	return nil
}

// Close writes the final checkpoint and closes the files. Call it after
// the exporter has shut down. It does not fail: a checkpoint it cannot
// write only means more replay at the next start, and is logged.
func (s *Spool) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		if s.started {
			// Chunks Kafka answered are finished (the watermark moves) before
			// the final checkpoint records it.
			close(s.stopFin)
			s.finWG.Wait()
			close(s.stopSync)
			s.syncWG.Wait()
		} else {
			s.mu.Lock()
			var err error
			if s.f != nil {
				err = s.f.Sync()
			}
			s.mu.Unlock()
			s.completeWaiters(1<<62, err)
		}
		s.ackMu.Lock()
		wm := s.wm
		s.ackMu.Unlock()
		if cerr := s.writeCheckpoint(wm); cerr != nil {
			// Not fatal: a stale checkpoint means more replay, not loss.
			s.logger.Warn("spool: final checkpoint not written; the next start replays more", "err", cerr)
		}
		s.mu.Lock()
		if s.f != nil {
			_ = s.f.Sync() // a graceful stop leaves nothing to the page cache
			s.f.Close()
		}
		s.mu.Unlock()
		if s.rf != nil {
			s.rf.Close()
		}
		if s.ckptFile != nil {
			s.ckptFile.Close()
		}
		s.lockFile.Close()
		s.logger.Info("spool closed", "backlog_bytes", s.Backlog())
	})
	return nil
}
