// Package filereceiver tails files on the host (receivers.files): one Kafka
// record per line, with the file's path and the line's byte offset as
// headers (ferry.file.path, ferry.file.offset), handed to the pipeline as
// record.Batches like every other receiver's.
//
// # Delivery and checkpoints
//
// The files are the buffer. One goroutine (run) matches the include globs
// every poll_interval and reads the files round-robin, one read of at most
// max_line_bytes+4KiB (and 4096 lines) per file per turn; each read becomes
// one batch, a span [start, end) of the file. A span's batch completes when
// Kafka acknowledged every line (or, in delivery.mode spool, when the spool
// fsync'd them: the same completion), and the file's committed offset
// advances only past a contiguous prefix of completed spans, so an offset
// is committed only when every line before it is durable. A file found
// new is read only once a checkpoint that knows it (at its first offset)
// is written, one write for the files of a poll: were ferry killed after
// handing its lines on and the file renamed away before the restart, the
// restart still finds it by inode. The committed
// offsets are written to checkpoint_dir/checkpoints.json (temp file, fsync,
// rename, fsync of the directory) at most once a second and at Shutdown; at
// Start a file resumes at its last checkpointed offset, so a kill -9
// repeats at most the lines that were in flight or acknowledged within the
// last second (at-least-once), and never skips one; a graceful stop waits
// for the acknowledgements (within its deadline) and checkpoints them.
//
// A refusal that retrying can fix (queue full, Kafka unreachable) keeps the
// span and hands the same lines on again later; nothing more of that file
// is read meanwhile, and no file is read while max_inflight_bytes (all
// files) or max_file_inflight_bytes (that file) are held: memory is
// bounded, nothing is dropped, the lines wait in the file. A record refused
// for good (too large for Kafka, unknown topic) is counted
// (ferry_files_dropped_records_total{reason}), logged and skipped, as the
// pipeline does with any record retrying cannot deliver; in spool mode such
// records are dead-lettered by the spool after it has taken them. A line
// that fails retryably after it was accepted (the exporter's shutdown
// timeout, a spool write error) rewinds the file to its committed offset:
// later lines already sent are sent again (duplicates, never loss), and
// the file's order is kept.
//
// # Identity, rotation, truncation
//
// A file is known by its device and inode together with a fingerprint, its
// first fingerprint_bytes bytes (fewer while it is shorter; it grows with
// the file). A file renamed away (rename-and-create rotation) or deleted
// while open keeps its descriptor: it is read to its end, and let go once it
// has not grown for rotate_wait; lines of a new file under the same path
// wait until the old one has no unread bytes, so a file's lines stay in
// order across a rotation; of several rotated files of one path (rotated
// again before ferry read them, or while it was stopped), each waits for
// the older ones, in the order ferry found them (born, kept in the
// checkpoint). A file found shorter than the position read is
// truncated (copytruncate): it is read again from byte 0, and counted
// (ferry_files_truncations_total). A file under a known path with another
// inode, or a known inode whose first bytes changed (inode reused), is a
// new file, read from its start. A closed file (max_open_files is an LRU)
// that leaves the globs is looked for by inode in its directory, so a file
// rotated while closed, or while ferry was stopped, is still read to its
// end. start_at applies only to files found at the very first start (no
// checkpoint yet); files that appear later, or while ferry was stopped,
// are read from their first byte.
//
// # Lines
//
// Lines end with "\n" (a "\r" before it is dropped); empty lines are not
// sent. A line longer than max_line_bytes is split into records of that
// size, each but the last with the header ferry.file.continued: "true",
// counted once (ferry_receiver_errors_total{reason="line_too_long"}), so
// nothing is lost. The last line of a file without a final "\n" is sent
// when the file is let go (rotated or deleted), not while it may still be
// written. encoding latin-1 converts each line to UTF-8. With a multiline
// pattern, a group of lines (a stack trace) is one record (multiline.go):
// a group is cut out of one read like a line, so a committed offset never
// falls inside one.
//
// A truncated file's copy (copytruncate.go) is read from the committed
// offset before the file's new lines, so what was not read yet when the
// file was truncated comes from the copy.
//
// Known limits: the lines written between copytruncate's copy and its
// truncation are in neither file; a copy in another directory is not
// looked for; a file truncated and written past the old position between
// two polls looks like one that grew (the new lines before that position
// are not read); a file must stay under a matched path for one
// poll_interval to be seen at all; a file closed by max_open_files and
// deleted before it is opened again cannot be read to its end (counted,
// reason file_gone).
package filereceiver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/receivermetrics"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// maxBatchRecords bounds the lines of one read, so a read of very short
// lines does not cost more than a few MiB of per-record overhead.
const maxBatchRecords = 4096

// checkpointEvery is the most often the checkpoint is written.
const checkpointEvery = time.Second

// Receiver tails files.
type Receiver struct {
	cfg Config
	set telemetry.Settings
	log *telemetry.Limited
	m   *receivermetrics.Metrics
	fm  *fileMetrics
	// fpBuf: the poll's scratch for comparing an open file's first bytes
	// with its fingerprint (replaced), owned by the poll loop.
	fpBuf []byte
	// groupLines and groupBytes: fm.lines and fm.bytes by include glob.
	groupLines, groupBytes []prometheus.Counter
	next                   consumer.Consumer
	host                   string
	topic                  *template
	key                    *template  // nil: no key
	ml                     *multiline // nil: one record per line
	headers                []namedTemplate
	json                   *JSONLines // nil: lines are not read as JSON
	chunk                  int

	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
	kick   chan struct{}
	lock   *os.File
	once   sync.Once
	// abandoned: stopped as by a crash (tests): no final checkpoint.
	abandoned bool

	// Owned by the run goroutine.
	files         map[fileID]*file
	list          []*file // round-robin order
	orphans       []*file // renamed away or deleted, being drained
	saved         map[fileID]entry
	hadCheckpoint bool
	ckptTime      time.Time // when the checkpoint read at Start was written
	firstScan     bool
	scanGen       uint64
	tick          uint64
	open          int
	nextScan      time.Time
	lastCkpt      time.Time
	tokens        float64
	tokensAt      time.Time
	lines         []lineRef                              // scratch for framing
	finished      []doneEntry                            // files read to their end (gzip.go)
	unsaved       int                                    // files adopted since the last checkpoint written
	born          uint64                                 // the last file.born given (entry.Born)
	forcedAt      time.Time                              // the last checkpoint written for new files (at most one a poll)
	glob          func(pattern string) ([]string, error) // filepath.Glob; tests make it miss

	// mu guards what completions touch: every file's spans, committed
	// offset, generation and bytes in flight, and these.
	mu       sync.Mutex
	inflight int64 // bytes held by spans read and not complete (or pending)
	handed   int   // spans handed on and not complete
	dirty    bool  // the checkpoint is behind
}

type namedTemplate struct {
	name string
	t    *template
}

// New builds the receiver; it reads nothing before Start.
func New(cfg Config, env receiver.Env) (*Receiver, error) {
	if errs := cfg.Check(env.Bounds); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	r := &Receiver{cfg: cfg, set: env.Set, next: env.Next, chunk: cfg.chunkBytes(),
		stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1),
		files: map[fileID]*file{}, saved: map[fileID]entry{}, firstScan: true, glob: filepath.Glob}
	r.topic, _ = parseTemplate(cfg.Topic) // checked by Check
	if cfg.Key != "" {
		r.key, _ = parseTemplate(cfg.Key)
	}
	r.host, _ = os.Hostname()
	r.ml = newMultiline(cfg.Multiline)
	for _, name := range slices.Sorted(maps.Keys(cfg.Headers)) {
		t, _ := parseTemplate(cfg.Headers[name])
		r.headers = append(r.headers, namedTemplate{name, t})
	}
	if cfg.JSON.Enabled {
		r.json = &cfg.JSON
	}
	r.log = telemetry.NewLimited(env.Set.Logger.With("component", "receiver/files"), 10*time.Second)
	r.m = receivermetrics.New(env.Set.Registry, "files")
	r.fm = newFileMetrics(env.Set.Registry)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.tokens = float64(cfg.ReadRateBytes) // a second's worth to start with
	for _, g := range cfg.Include {
		// Every group's series exists from the start, at 0.
		r.fm.rotations.WithLabelValues(g)
		r.fm.truncations.WithLabelValues(g)
		r.fm.watched.WithLabelValues(g)
		r.groupLines = append(r.groupLines, r.fm.lines.WithLabelValues(g))
		r.groupBytes = append(r.groupBytes, r.fm.bytes.WithLabelValues(g))
		r.fm.lag.WithLabelValues(g)
	}
	return r, nil
}

// Start takes the checkpoint directory, reads the checkpoint and starts
// reading; the first poll runs at once.
func (r *Receiver) Start(context.Context) error {
	lf, err := lockDir(r.cfg.CheckpointDir)
	if err != nil {
		return fmt.Errorf("checkpoint_dir: %w", err)
	}
	r.lock = lf
	doc, found, err := loadCheckpoint(r.cfg.CheckpointDir)
	if err != nil {
		r.m.Error("checkpoint_read")
		r.set.Logger.Error("files: checkpoint not read", "component", "receiver/files", "err", err)
	}
	r.resume(doc, found)
	go r.run()
	return nil
}

// resume takes the checkpoint read at Start: the files to find again.
func (r *Receiver) resume(doc checkpointDoc, found bool) {
	r.hadCheckpoint = found
	if fi, err := os.Stat(filepath.Join(r.cfg.CheckpointDir, checkpointName)); err == nil {
		r.ckptTime = fi.ModTime()
	}
	for _, e := range doc.Files {
		r.saved[fileID{e.Dev, e.Ino}] = e
		r.born = max(r.born, e.Born)
	}
	r.finished = doc.Done
}

// Shutdown stops reading, waits within ctx for the lines handed on to be
// acknowledged, and writes the checkpoint: lines not acknowledged by then
// are read again at the next start.
func (r *Receiver) Shutdown(ctx context.Context) error {
	started := r.lock != nil
	r.once.Do(func() {
		close(r.stop)
		r.cancel()
	})
	if !started {
		return nil
	}
	<-r.done
	var err error
	for !r.abandoned {
		r.mu.Lock()
		n := r.handed
		r.mu.Unlock()
		if n == 0 {
			break
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-r.kick:
		case <-t.C:
		case <-ctx.Done():
			err = fmt.Errorf("files: %d batches not acknowledged before the stop; their lines are read again at the next start", n)
		}
		t.Stop()
		if err != nil {
			break
		}
	}
	if !r.abandoned {
		if cerr := r.checkpoint(true); cerr != nil && err == nil {
			err = cerr
		}
	}
	for _, f := range r.list {
		r.closeFile(f)
	}
	r.fm.open.Set(0)
	r.lock.Close()
	r.lock = nil
	return err
}

// wake tells the run loop that something it waits for changed.
func (r *Receiver) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run is the one goroutine that reads: poll, one read per file per turn,
// checkpoint; it sleeps when no file can move until a poll, a retry, the
// rate limit or a completion.
func (r *Receiver) run() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		if !now.Before(r.nextScan) {
			r.scan(now)
			r.nextScan = now.Add(r.cfg.PollInterval)
		}
		if r.unsaved > 0 && now.Sub(r.forcedAt) >= r.cfg.PollInterval {
			r.forcedAt = now
			// New files are read only once the checkpoint knows them:
			// were ferry killed after handing their lines on, and the
			// files renamed away before it is back, the restart finds
			// them by inode and reads them again. One write for every
			// file found in the poll.
			if err := r.checkpoint(true); err != nil {
				// The disk holding it is full or failing: the new files are
				// read all the same (waiting would stall them for as long
				// as the disk is full); if ferry is killed before a
				// checkpoint gets through, the restart finds them rotated
				// or not by their names and times (adoptRotatedSince).
				r.m.Error("checkpoint_write")
				r.log.Log(slog.LevelError, "checkpoint", "files: checkpoint not written; it is tried again", "err", err)
				for _, f := range r.list {
					f.unsaved = false
				}
				r.unsaved = 0
			}
		}
		progress := r.round(now)
		if err := r.checkpoint(false); err != nil {
			r.m.Error("checkpoint_write")
			r.log.Log(slog.LevelError, "checkpoint", "files: checkpoint not written; it is tried again", "err", err)
		}
		select {
		case <-r.stop:
			r.discardPending()
			return
		default:
		}
		if progress {
			continue
		}
		timer.Reset(r.sleep(time.Now()))
		select {
		case <-r.stop:
			r.discardPending()
			return
		case <-r.kick:
		case <-timer.C:
		}
	}
}

// sleep is how long nothing can move: until the next poll, the earliest
// retry, the rate limit's refill or the checkpoint due.
func (r *Receiver) sleep(now time.Time) time.Duration {
	d := r.nextScan.Sub(now)
	for _, f := range r.list {
		if !f.retryAt.IsZero() && f.retryAt.After(now) {
			d = min(d, f.retryAt.Sub(now))
		}
	}
	for _, o := range r.orphans {
		// When an orphan read to its end may be let go (a deadline past is
		// waiting for a completion, which wakes the loop itself).
		if t := o.still.Add(r.cfg.RotateWait); o.examined >= o.size && t.After(now) {
			d = min(d, t.Sub(now))
		}
	}
	if r.ml != nil {
		for _, f := range r.list {
			if t := f.heldAt.Add(r.ml.flush); f.held && t.After(now) {
				d = min(d, t.Sub(now))
			}
		}
	}
	if r.cfg.ReadRateBytes > 0 && r.tokens <= 0 {
		d = min(d, time.Duration(-r.tokens/float64(r.cfg.ReadRateBytes)*float64(time.Second))+time.Millisecond)
	}
	r.mu.Lock()
	if r.dirty {
		d = min(d, r.lastCkpt.Add(checkpointEvery).Sub(now))
	}
	r.mu.Unlock()
	return max(d, time.Millisecond)
}

// discardPending drops the spans refused and waiting for a retry: they
// were never taken, and their lines are after the committed offset.
func (r *Receiver) discardPending() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.list {
		if s := f.pending; s != nil {
			f.pending = nil
			r.inflight -= s.mem
			f.inflight -= s.mem
		}
	}
	r.fm.inflight.Set(float64(r.inflight))
}

// round gives every file one turn; it reports whether any moved.
func (r *Receiver) round(now time.Time) bool {
	r.tick++
	progress := false
	for _, f := range r.list {
		if r.step(f, now) {
			progress = true
		}
	}
	r.reap()
	return progress
}

// step is one file's turn: hand on a refused span again, or read and hand
// on the next one, or let a drained orphan go.
func (r *Receiver) step(f *file, now time.Time) bool {
	if f.released {
		return r.stepReleased(f, now)
	}
	if f.unsaved {
		return false // until a checkpoint knows it (run)
	}
	r.mu.Lock()
	if f.rewind {
		// A span failed retryably after it was taken: read again from the
		// committed offset (later spans' lines are sent again). Every span
		// still listed was read at the old position: a new generation, so
		// none of them (nor one being read now) can move the committed
		// offset past the failed lines.
		r.forgetLocked(f)
		f.readOff, f.examined, f.inLong, f.held = f.committed, f.committed, false, false
		f.retryAt = now.Add(100 * time.Millisecond)
	}
	room := r.inflight < int64(r.cfg.MaxInflightBytes) && f.inflight < int64(r.cfg.MaxFileInflightBytes)
	r.mu.Unlock()
	if now.Before(f.retryAt) {
		return false
	}
	f.retryAt = time.Time{}
	if f.pending != nil {
		return r.hand(f, f.pending, now)
	}
	flush, final := false, false
	if f.examined >= f.size {
		quiet := !now.Before(f.still.Add(r.cfg.RotateWait))
		if f.orphan && quiet {
			return r.letGo(f, now)
		}
		// A copytruncate copy under the globs is never let go, yet its
		// path's file waits until it is drained (olderUnread): a copy does
		// not grow, so once quiet its unterminated rest (a line the writer
		// had half written when it was copied) and a held group are sent.
		final = f.first && !f.orphan && quiet && f.readOff < f.size
		if flush = final || r.flushDue(f, now); !flush {
			return false
		}
	}
	if !room || r.olderUnread(f) {
		return false
	}
	if !r.rateOK(now) {
		return false
	}
	if !r.ensureOpen(f, now) {
		return false
	}
	if r.replaced(f, f.size) {
		// Truncated and written past ferry's position since the last poll
		// (copytruncate): what lies at readOff is new content, not the rest
		// of what was read. Its copy first, then the file from byte 0 (the
		// copy, older, goes first: olderUnread at the next step).
		r.recoverCopy(f, now)
		r.truncated(f)
		// The size the poll saw was the old content's: kept, the next poll
		// would take the new content, shorter, for another truncation and
		// send what was read of it again.
		if fi, err := f.f.Stat(); err == nil {
			f.size = fi.Size()
		}
		r.fillFP(f)
		return true
	}
	if !f.decided && !r.decide(f) {
		return false
	}
	s := r.read(f, now, final, flush)
	if s == nil {
		return false
	}
	return r.hand(f, s, now)
}

// flushDue: f holds back a multiline group and has been quiet for
// flush_timeout since.
func (r *Receiver) flushDue(f *file, now time.Time) bool {
	return f.held && r.ml != nil && !now.Before(f.heldAt.Add(r.ml.flush))
}

// olderUnread: an orphan first seen under f's path still has bytes to read
// (f replaced it in a rotation), so f waits and the path's lines stay in
// order. An orphan (or a copy) waits likewise for the older orphans of its
// path only (born): two generations rotated away before ferry read them
// (ferry busy, or stopped: both found by inode at the restart) are read
// one after the other, oldest first, not round-robin.
func (r *Receiver) olderUnread(f *file) bool {
	rotated := f.orphan || f.first
	for _, o := range r.orphans {
		// readOff < size: bytes not sent yet, including an unterminated
		// last line or a multiline group that waits for the let-go. A
		// copytruncate copy under the globs (first) is drained likewise.
		if o.path != f.path || o == f || !(o.orphan || o.first) || o.released || (o.readOff >= o.size && o.pending == nil) {
			continue
		}
		if !rotated || o.born < f.born {
			return true
		}
	}
	return false
}

// letGo sends an orphan's unterminated last line, if any, and closes it
// once every span of it is complete (one that fails retryably is read
// again through the descriptor, which only this one holds).
func (r *Receiver) letGo(f *file, now time.Time) bool {
	if f.pending != nil {
		return false
	}
	if f.readOff < f.size && r.ensureOpen(f, now) {
		if s := r.read(f, now, true, true); s != nil {
			return r.hand(f, s, now)
		}
		if f.readOff < f.size {
			return false // a read error: tried again
		}
	}
	r.mu.Lock()
	busy := len(f.spans) > 0 || f.rewind
	r.mu.Unlock()
	if busy {
		return false // a completion wakes the loop
	}
	r.remember(f)
	r.closeFile(f)
	f.released = true
	r.mu.Lock()
	r.dirty = true
	r.mu.Unlock()
	return true
}

// reap forgets released files that have nothing in flight.
func (r *Receiver) reap() {
	keep := r.list[:0]
	r.mu.Lock()
	for _, f := range r.list {
		if f.released && len(f.spans) == 0 && f.pending == nil && f.inflight == 0 {
			delete(r.files, f.id)
			r.dirty = true
			continue
		}
		keep = append(keep, f)
	}
	r.mu.Unlock()
	clear(r.list[len(keep):])
	r.list = keep
	ok := r.orphans[:0]
	for _, o := range r.orphans {
		if o.first && o.readOff >= o.size && o.pending == nil {
			o.first = false // drained: an ordinary file under the globs
		}
		if (o.orphan || o.first) && !o.released {
			ok = append(ok, o)
		}
	}
	clear(r.orphans[len(ok):])
	r.orphans = ok
}

// forgetLocked answers a rewind: the refused span and every span listed
// (read at positions a failure has made stale) no longer count, under a new
// generation, so none of them, nor one being read now, can move the
// committed offset past the failed lines.
func (r *Receiver) forgetLocked(f *file) {
	f.rewind = false
	r.dropPendingLocked(f)
	f.gen++
	clear(f.spans)
	f.spans = nil
}

// stepReleased is the turn of a file that is gone (deleted while closed,
// or not found again): a span already read and refused is still in memory
// and is handed on again like any other; a span that failed after it was
// taken cannot be read again, so its lines are counted lost (file_gone)
// and its memory given back, and the file is reaped.
func (r *Receiver) stepReleased(f *file, now time.Time) bool {
	r.mu.Lock()
	if f.rewind {
		r.forgetLocked(f)
		r.mu.Unlock()
		r.m.Error("file_gone")
		return false
	}
	r.mu.Unlock()
	if f.pending == nil || now.Before(f.retryAt) {
		return false
	}
	f.retryAt = time.Time{}
	return r.hand(f, f.pending, now)
}

// rateOK: read_rate_bytes has bytes left (a read may overdraw it; the next
// waits for the refill).
func (r *Receiver) rateOK(now time.Time) bool {
	rate := float64(r.cfg.ReadRateBytes)
	if rate <= 0 {
		return true
	}
	if !r.tokensAt.IsZero() {
		r.tokens = min(r.tokens+now.Sub(r.tokensAt).Seconds()*rate, max(rate, float64(r.chunk)))
	}
	r.tokensAt = now
	return r.tokens > 0
}

// hand gives a span to the pipeline. A span without records (empty lines
// only) completes at once, in its place.
func (r *Receiver) hand(f *file, s *span, now time.Time) bool {
	r.mu.Lock()
	if s.gen != f.gen {
		// A truncation or rewind since it was read: its lines are stale.
		if f.pending == s {
			f.pending = nil
		}
		r.inflight -= s.mem
		f.inflight -= s.mem
		r.mu.Unlock()
		return true
	}
	f.pending = nil
	f.spans = append(f.spans, s)
	r.handed++
	r.mu.Unlock()
	if len(s.b.Records) == 0 {
		r.complete(s, nil)
		return true
	}
	s.sent = now
	n := len(s.b.Records) // the batch may complete before Consume returns
	s.b.OnDone(s.doneFn)
	err := r.next.Consume(r.ctx, &s.b)
	if err == nil {
		r.m.Received(r.set.Topics.Get(f.topic), n, s.bytes)
		r.groupLines[f.group].Add(float64(n))
		r.groupBytes[f.group].Add(float64(s.bytes))
		r.m.Items("logs", n)
		return true
	}
	s.b.PopDone()
	var pe *consumer.PermanentError
	if errors.As(err, &pe) {
		// Refused for good before it was taken (a record too large for the
		// spool, a topic Kafka does not have): counted and skipped.
		r.m.Error(pe.Reason)
		r.drop(pe.Reason, n, err, f)
		r.settle(s, false)
		return true
	}
	// Retryable (queue full, Kafka unreachable, stopping): the same lines
	// again later; nothing more of this file is read meanwhile.
	reason := consumer.Reason(err)
	r.m.Error(reason)
	delay := time.Second
	var re *consumer.RetryableError
	if errors.As(err, &re) {
		delay = min(max(re.After, 10*time.Millisecond), time.Second)
		if re.Busy {
			delay = 20 * time.Millisecond
		}
	}
	r.mu.Lock()
	if n := len(f.spans); n > 0 && f.spans[n-1] == s {
		f.spans[n-1] = nil
		f.spans = f.spans[:n-1]
		f.pending = s
	} else {
		// A rewind or truncation came in between: the span is stale.
		r.inflight -= s.mem
		f.inflight -= s.mem
	}
	r.handed--
	r.mu.Unlock()
	f.retryAt = now.Add(delay)
	return false
}

// drop counts and logs records skipped for good.
func (r *Receiver) drop(reason string, n int, err error, f *file) {
	r.fm.dropped.WithLabelValues(reason).Add(float64(n))
	r.log.Log(slog.LevelError, "drop:"+reason, "files: lines refused for good are skipped", "path", f.path, "lines", n, "reason", reason, "err", err)
}

// permanent: retrying cannot fix err. Anything unclassified is retried.
func permanent(err error) bool {
	var pe *consumer.PermanentError
	return errors.As(err, &pe)
}

// complete is a span's batch completion (on the pipeline's goroutine).
func (r *Receiver) complete(s *span, err error) {
	retry := s.retry.Load()
	if err != nil && !s.sawFailure.Load() {
		// Failed without a word per record (a spool write, a batch failed
		// whole): the batch's error speaks for every failed record.
		if permanent(err) {
			r.m.Error(consumer.Reason(err))
			r.drop(consumer.Reason(err), max(s.b.Failed(), 1), err, s.f)
		} else {
			retry = true
		}
	}
	if !s.sent.IsZero() {
		r.m.AckLatency.Observe(time.Since(s.sent).Seconds())
	}
	r.settle(s, retry)
}

// settle records a span as complete: done (every line acknowledged or
// skipped for good), or to be read again (retry).
func (r *Receiver) settle(s *span, retry bool) {
	f := s.f
	// Every stage is done with the batch (this completion, attached first,
	// runs last): its buffers go now, even while the span waits in f.spans
	// for an older one, as the in-flight bytes say.
	s.b.Records = nil
	r.mu.Lock()
	r.handed--
	r.inflight -= s.mem
	f.inflight -= s.mem
	if s.gen == f.gen {
		if retry {
			select {
			case <-r.stop:
				// Stopping: the span stays in f.spans, not done, so the
				// committed offset never passes it.
			default:
				f.gen++
				clear(f.spans)
				f.spans = nil
				f.rewind = true
			}
		} else {
			s.done = true
			for len(f.spans) > 0 && f.spans[0].done {
				f.committed = f.spans[0].end
				f.spans[0] = nil
				f.spans = f.spans[1:]
			}
			r.dirty = true
		}
	}
	r.fm.inflight.Set(float64(r.inflight))
	r.mu.Unlock()
	r.wake()
}

// dropPendingLocked forgets f's refused span. Called with r.mu held.
func (r *Receiver) dropPendingLocked(f *file) {
	if s := f.pending; s != nil {
		f.pending = nil
		r.inflight -= s.mem
		f.inflight -= s.mem
	}
}

// checkpoint writes every known file's committed offset, when it changed
// and at most once a second (force: now, as at Shutdown).
func (r *Receiver) checkpoint(force bool) error {
	now := time.Now()
	r.mu.Lock()
	if !force && (!r.dirty || now.Sub(r.lastCkpt) < checkpointEvery) {
		r.mu.Unlock()
		return nil
	}
	entries := make([]entry, 0, len(r.list))
	for _, f := range r.list {
		if f.released && len(f.spans) == 0 && f.pending == nil {
			continue
		}
		entries = append(entries, entry{Path: f.path, Current: f.cur, Dev: f.id.dev, Ino: f.id.ino,
			FPLen: len(f.fp), FPHash: f.fpH, Offset: f.committed, Born: f.born})
	}
	// Files of the checkpoint not found again yet keep their entries until
	// the first poll has looked for them.
	for _, e := range r.saved {
		entries = append(entries, e)
	}
	r.dirty = false
	r.lastCkpt = now
	r.mu.Unlock()
	if err := writeCheckpoint(r.cfg.CheckpointDir, entries, r.finished); err != nil {
		r.mu.Lock()
		r.dirty = true
		r.mu.Unlock()
		return err
	}
	r.fm.checkpoints.Inc()
	if r.unsaved > 0 {
		// Every file listed is in the checkpoint now: new ones may be read.
		for _, f := range r.list {
			f.unsaved = false
		}
		r.unsaved = 0
	}
	return nil
}

// span is one read of a file, [start, end), handed on as one batch.
type span struct {
	f          *file
	gen        uint64
	start, end int64
	b          record.Batch
	mem        int64
	bytes      int // key and value bytes, for the received metrics
	sent       time.Time
	done       bool // guarded by Receiver.mu
	retry      atomic.Bool
	sawFailure atomic.Bool
	doneFn     func(error)
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), uint64(st.Ino)}, true //nolint:unconvert // Dev's type differs by platform
}
