package spool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receipt"
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
	// Receipts keeps the receipts of requests that asked for one (see
	// receipts.go); nil: none are kept, and a batch asking for one gets
	// no receipt id.
	Receipts *receipt.Store
	// Resume, when set (delivery.guarantee exactly_once), says how far
	// Kafka has committed this spool: the reader asks it before reading
	// anything and starts there when it is past the checkpoint, so what
	// Kafka committed before a crash is never produced again. ok false:
	// nothing committed yet. An error is retried (nothing is read until
	// it answers): starting from the checkpoint instead could duplicate.
	Resume func(ctx context.Context) (p record.SpoolPos, ok bool, err error)
	// Idem, when set (delivery mode spool), remembers the idempotency
	// keys of requests: the spool writes a batch's key (Batch.Idem) to
	// its key log with the records, resolves the store's reservation
	// before the batch completes, and gives the store back the keys
	// whose records are durable at Open (keys.go).
	Idem *idempotency.Store
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

// Spool is an open spool directory. Its state is split by who owns it,
// each part with its own lock (see doc.go, "Parts"): the appender (the
// active segment, the bytes on disk), the syncer (fsync and the appends
// waiting for it), the reader (its position, owned by its goroutine), the
// ledger (what Kafka has acknowledged: the watermark and checkpoint) and
// the finisher (I/O handed off the Kafka client's promise goroutine).
type Spool struct {
	cfg      Config
	maxFrame int
	// wfmt seals the frames of the active segment (each segment draws its
	// own secret; Consume encodes with it before taking mu, and an append
	// that finds it changed by a roll seals its frames again). maxSegFrame
	// is the largest frame limit recorded in any segment found at Open (the
	// reader must be able to hold one such frame, whatever the config says
	// now).
	wfmt        atomic.Pointer[segFormat]
	maxSegFrame int
	log         *telemetry.Limited
	logger      *slog.Logger
	m           *metrics
	lockFile    *os.File
	links       Links
	started     bool
	closeOnce   sync.Once

	appender
	syncer
	reader
	ledger
	finisher
}

// appender is the write side: the active segment and the bytes on disk.
// mu guards every field but appending and bufPool.
type appender struct {
	mu      sync.Mutex
	f       *os.File
	wseg    uint64
	woff    int64
	written int64
	segs    map[uint64]int64 // bytes of every segment on disk, the active one included
	// v1 are the segments of the old format (FRYSPL01) found at recovery,
	// whose records start after an 8-byte header, not segHeader.
	v1      map[uint64]bool
	disk    int64
	failErr error // sticky: a failed fsync or segment roll
	durable int64 // written bytes a segment roll's fsync has made durable
	// fsync is (*os.File).Sync; tests replace it to fail.
	fsync   func(*os.File) error
	closing bool
	// recycled: the active file was a spare, so it may be longer than woff
	// (its old bytes are cut off when it is sealed or closed). spares are
	// emptied segment files kept to be overwritten rather than deleted and
	// created again (see recycle.go); spareSlots counts them and those
	// being renamed into place.
	recycled   bool
	maxSpares  int // maxSpares; 0 in the benchmark's reference run
	spares     []spare
	spareSlots int
	spareSeq   uint64

	appending atomic.Int64 // bytes of appends in progress (the disk bound counts them)
	bufPool   sync.Pool
	appendTail
	keyLog
	idem *idempotency.Store // Links.Idem
}

// syncer makes appends durable: one fsync for every append waiting
// (group commit). syncMu is held around an fsync (and by a roll while it
// closes a file); waitMu guards waiters.
type syncer struct {
	syncMu   sync.Mutex
	waitMu   sync.Mutex
	waiters  []waiter
	syncKick chan struct{}
	stopSync chan struct{}
	syncWG   sync.WaitGroup // the syncer and the checkpointer
}

// reader streams the log to the exporter. Its position and buffers are
// owned by the reader goroutine alone (no lock); the kicks wake it.
type reader struct {
	budget  *budget.Budget
	ceiling int64
	chunk   int

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

	dataKick chan struct{}
	freeKick chan struct{}
	stopRead chan struct{}
	readStop atomic.Bool
	readWG   sync.WaitGroup
	// stopReadOnce closes stopRead once, from Shutdown or Close.
	stopReadOnce sync.Once
}

// ledger is what Kafka has acknowledged: chunks in read order, the
// watermark every record before which is acknowledged, and the checkpoint
// that records it on disk. ackMu guards it.
type ledger struct {
	ackMu      sync.Mutex
	fifo       []*mark
	wm         pos // every record before wm is acknowledged
	ckpt       pos // wm as last written to the checkpoint
	ckptFile   *os.File
	replayDone bool
	startedAt  time.Time
	// retiredBefore: the finisher was last asked to retire the segments
	// before this one (settle asks again when wm enters a later one).
	retiredBefore uint64

	// ckptTick, when a test sets it before Start, replaces the
	// checkpointer's one-second ticker: each value received is one pass.
	ckptTick chan time.Time
}

// finisher runs the I/O that completions must not run on the Kafka
// client's promise goroutine (see finish.go). finMu guards finQ.
type finisher struct {
	finMu   sync.Mutex
	finQ    []finTask
	finKick chan struct{}
	stopFin chan struct{}
	finWG   sync.WaitGroup
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
	s := &Spool{cfg: cfg, links: l,
		appender: appender{segs: map[uint64]int64{}, fsync: (*os.File).Sync, maxSpares: maxSpares, idem: l.Idem},
		syncer:   syncer{syncKick: make(chan struct{}, 1), stopSync: make(chan struct{})},
		reader: reader{budget: l.Budget, chunk: 1 << 20, dataKick: make(chan struct{}, 1), freeKick: make(chan struct{}, 1),
			stopRead: make(chan struct{})},
		finisher: finisher{finKick: make(chan struct{}, 1), stopFin: make(chan struct{})}}
	s.maxFrame = l.MaxRecordBytes + 4096
	if l.MaxRecordBytes <= 0 {
		s.maxFrame = 8 << 20
	}
	wf, err := newSegFormat(s.maxFrame)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s.wfmt.Store(wf)
	s.maxSegFrame = s.maxFrame
	s.logger = set.Logger.With("component", "buffer/spool")
	s.log = telemetry.NewLimited(s.logger, 30*time.Second)
	s.m = newMetrics(set.Registry, s)
	s.chunks.New = func() any {
		c := &chunk{s: s}
		c.doneFn, c.failFn, c.dlNowFn = c.onDone, c.onFailure, c.deadLetterNow
		return c
	}
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

// Start begins delivering: the reader, the finisher, the syncer and the
// checkpointer.
func (s *Spool) Start(context.Context) error {
	s.ceiling = max(int64(s.cfg.ReadAhead), int64(2*s.maxSegFrame))
	s.ceiling = min(s.ceiling, s.budget.Limit())
	s.chunk = int(min(1<<20, max(64<<10, s.ceiling/4)))
	s.tailMax = min(8<<20, max(int64(s.chunk), s.ceiling/4))
	s.started = true
	s.startedAt = time.Now()
	s.readWG.Add(1)
	go s.read()
	s.finWG.Add(1)
	go s.finishLoop()
	s.syncWG.Add(2)
	go s.syncLoop()
	go s.checkpointer()
	return nil
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
		start := segHeader
		if s.v1[id] {
			start = segHeaderV1
		}
		switch {
		case id == wm.seg:
			n += max(0, size-max(wm.off, start))
		case id > wm.seg:
			// Clamped: a damaged segment shorter than its header holds
			// nothing, and must not hide the others' bytes.
			n += max(0, size-start)
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
	s.stopReader()
	return nil
}

// stopReader stops the reader goroutine and waits for it; Shutdown and
// Close both call it, so Close alone (without Shutdown) is safe too.
func (s *Spool) stopReader() {
	s.readStop.Store(true)
	if s.started {
		s.stopReadOnce.Do(func() { close(s.stopRead) })
		s.readWG.Wait()
		s.dropTail()
	}
}

// Close writes the final checkpoint and closes the files. Call it after
// the exporter has shut down. It does not fail: a checkpoint it cannot
// write only means more replay at the next start, and is logged.
func (s *Spool) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		s.mu.Unlock()
		// The reader owns its file (s.rf) until it has stopped.
		s.stopReader()
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
			if s.kf != nil {
				err = s.kf.Sync()
			}
			if s.f != nil && err == nil {
				s.trimRecycled()
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
			s.trimRecycled()
			_ = s.f.Sync() // a graceful stop leaves nothing to the page cache
			s.f.Close()
		}
		if s.kf != nil {
			_ = s.kf.Sync()
			s.kf.Close()
			s.kf = nil
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

// trimRecycled cuts a recycled active file's old bytes off at a graceful
// stop, so the next start finds a segment that ends at its last frame. A
// failure only leaves them for recovery to trim: it never fails the sync
// that makes the appended records durable. Called with s.mu held.
func (s *Spool) trimRecycled() {
	if !s.recycled {
		return
	}
	if err := s.f.Truncate(s.woff); err != nil {
		s.logger.Warn("spool: the recycled segment's old bytes were not cut off; the next start trims them", "err", err)
		return
	}
	s.recycled = false
}

func kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
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

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
