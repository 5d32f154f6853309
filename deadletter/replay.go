package deadletter

// Replay: the dead letters of the file sent to Kafka again, once what made
// Kafka refuse them is fixed (the topic created, the ACL granted, the
// broker's message.max.bytes raised), for ferry deadletter replay.
//
// Never lose a dead letter: the file is read, never changed while the
// records are sent, and replaced at the end, atomically (a new file in the
// same directory, fsynced, renamed over it), by the lines that are not in
// Kafka: those Kafka failed again, those of other topics (Topic), those
// that are not dead letters, and those not sent or not answered when the
// replay was interrupted — each byte for byte, in the file's order. A line
// is left out only after Kafka acknowledged its record. If nothing is left
// the file is removed. A crash or kill before the rename leaves the file
// as it was: the records already acknowledged are sent again by the next
// replay (duplicates, never loss).
//
// The agent appends to the file through a descriptor it keeps open, so
// replacing the file under a running agent would lose what it appends
// meanwhile: the caller (cmd/ferry) refuses to replay while the agent
// holds its spool.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// ReplayOptions are what ferry deadletter replay was asked.
type ReplayOptions struct {
	// File is the dead-letter file.
	File string
	// Topic, when set, sends only the dead letters of this topic (their
	// original topic); the others stay in the file.
	Topic string
	// Rate is the most records sent per second (> 0).
	Rate int
	// DryRun reads the file and counts what would be sent, sending nothing
	// and changing nothing.
	DryRun bool
	// InFlight bounds the records sent and not yet answered (0: 1000): what
	// the replay holds in memory besides the file's reader.
	InFlight int
	// Grace is how long an interrupted replay waits for Kafka to answer
	// for the records it sent (0: 10 s); those still unanswered stay in
	// the file.
	Grace time.Duration
	// Progress, when set, is called about once a second while sending and
	// once at the end.
	Progress func(ReplayProgress)
	// MaxLineBytes bounds the line read into memory and decoded (0:
	// DefaultMaxLineBytes). A longer line is not a dead letter ferry wrote
	// (those hold a record the exporter took, in base64): it is never
	// held in memory, only copied, byte for byte, into the new file.
	MaxLineBytes int
}

// DefaultMaxLineBytes is ReplayOptions.MaxLineBytes' default: the line of
// a 16 MiB record, in base64, with room.
const DefaultMaxLineBytes = 32 << 20

// ReplayProgress is how far a replay is.
type ReplayProgress struct {
	Lines    int // in the file, counted before sending
	Read     int
	Sent     int
	Failed   int
	Skipped  int // other topics, lines that are not dead letters
	InFlight int
	Elapsed  time.Duration
}

// ReplaySummary is what a replay did.
type ReplaySummary struct {
	File  string
	Lines int
	// Sent: acknowledged by Kafka and removed from the file (dry run: would
	// be sent), by topic in Topics.
	Sent   int
	Topics map[string]int
	// Failed: Kafka refused them again, by reason; they stay in the file.
	Failed map[string]int
	// Skipped: dead letters of another topic than Topic; Unreadable: lines
	// that are not dead letters; TooLong: lines over MaxLineBytes, not
	// read. All stay in the file.
	Skipped    int
	Unreadable int
	TooLong    int
	// NotSent: lines not sent because the replay was interrupted;
	// Unanswered: sent, but Kafka had not answered when the replay ended.
	// Both stay in the file (the unanswered may reach Kafka too: a later
	// replay may duplicate them).
	NotSent    int
	Unanswered int
	// Kept is the lines left in the file; Removed says the file was removed
	// because none is left.
	Kept        int
	Removed     bool
	Interrupted bool
}

// FailedTotal is the records Kafka refused again.
func (s *ReplaySummary) FailedTotal() int {
	n := 0
	for _, v := range s.Failed {
		n += v
	}
	return n
}

type itemState uint8

const (
	itemKeep     itemState = iota // not sent: stays in the file
	itemToSend                    // waiting for its turn
	itemInFlight                  // sent, no answer yet
	itemAcked                     // in Kafka: leaves the file
	itemFailed                    // refused again: stays in the file
)

// item is one line of the file, kept until everything before it is settled
// so the file keeps its order.
type item struct {
	line  []byte
	rec   record.Record
	state itemState
	// long: a line over MaxLineBytes, not held (line is nil): its n bytes
	// at off in the file are copied when it is written out; nl says
	// whether they end with a newline.
	long bool
	nl   bool
	off  int64
	n    int64
}

type replayer struct {
	o    ReplayOptions
	next consumer.Consumer
	sum  ReplaySummary
	in   *os.File // the file, read at off by rd
	rd   *bufio.Reader
	off  int64
	out  *os.File // the new file (nil in a dry run)
	w    *bufio.Writer
	lim  *limiter
	t0   time.Time

	// queue: the lines read and not yet written out or dropped, in file
	// order, and their bytes.
	queue  []*item
	queued int

	mu       sync.Mutex
	inflight int
	failed   int
	sent     int
	// closed: the summary is final; answers arriving later (an interrupted
	// replay's) change nothing.
	closed   bool
	answered chan struct{}
}

// Replay sends the dead letters of o.File to next (the Kafka exporter) at
// most o.Rate a second and then replaces the file by what Kafka did not
// take (see the file comment). ctx ending interrupts it: nothing more is
// sent, the answers to what was sent are awaited for o.Grace, and the file
// is rewritten all the same. The error is nil if the file is as the
// summary says.
func Replay(ctx context.Context, o ReplayOptions, next consumer.Consumer) (*ReplaySummary, error) {
	if o.Rate <= 0 {
		return nil, errors.New("rate: must be at least 1 record a second")
	}
	if o.InFlight <= 0 {
		o.InFlight = 1000
	}
	if o.Grace <= 0 {
		o.Grace = 10 * time.Second
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
	in, err := os.Open(o.File)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	r := &replayer{o: o, next: next, in: in, answered: make(chan struct{}, 1), t0: time.Now(),
		sum: ReplaySummary{File: o.File, Topics: map[string]int{}, Failed: map[string]int{}}}
	if r.sum.Lines, err = countLines(in); err != nil {
		return nil, err
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if !o.DryRun {
		if r.out, err = newBeside(in, o.File); err != nil {
			return nil, err
		}
		r.w = bufio.NewWriterSize(r.out, 256<<10)
		defer func() {
			if r.out != nil { // not renamed: an error on the way
				r.out.Close()
				_ = os.Remove(r.out.Name())
			}
		}()
	}
	r.lim = newLimiter(o.Rate, r.t0)
	r.rd = bufio.NewReaderSize(in, 256<<10)
	if err := r.run(ctx); err != nil {
		return &r.sum, err
	}
	return &r.sum, r.finish()
}

// readLine reads the next line: its bytes when it is at most
// MaxLineBytes, else an item that only says where it is (its bytes are
// read past, never held). n is 0 at the end of the file.
func (r *replayer) readLine() (line []byte, long *item, n int64, err error) {
	off := r.off
	for {
		frag, ferr := r.rd.ReadSlice('\n')
		n += int64(len(frag))
		if long == nil {
			if n > int64(r.o.MaxLineBytes) {
				long, line = &item{long: true, off: off}, nil
			} else {
				line = append(line, frag...)
			}
		}
		if errors.Is(ferr, bufio.ErrBufferFull) {
			continue
		}
		r.off += n
		if long != nil {
			long.n, long.nl = n, ferr == nil
			long.state = itemKeep
		}
		if ferr != nil && !errors.Is(ferr, io.EOF) {
			return nil, nil, n, ferr
		}
		if errors.Is(ferr, io.EOF) {
			err = io.EOF
		}
		return line, long, n, err
	}
}

// newBeside creates the file that will replace name: in its directory
// (a rename does not cross file systems), with its mode and owner (the
// agent must still be able to append to it).
func newBeside(in *os.File, name string) (*os.File, error) {
	fi, err := in.Stat()
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(filepath.Dir(name), fmt.Sprintf(".%s.replay-%d", filepath.Base(name), os.Getpid()))
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := out.Chown(int(st.Uid), int(st.Gid)); err != nil && int(st.Uid) != os.Geteuid() {
			out.Close()
			_ = os.Remove(tmp)
			return nil, fmt.Errorf("the new %s could not be given to its owner (uid %d) as the old one was: run the replay as that user or root (%w)", name, st.Uid, err)
		}
	}
	return out, nil
}

func countLines(f *os.File) (int, error) {
	buf := make([]byte, 256<<10)
	n, last := 0, byte('\n')
	for {
		k, err := f.Read(buf)
		n += bytes.Count(buf[:k], []byte{'\n'})
		if k > 0 {
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			if last != '\n' {
				n++ // a last line without its newline
			}
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// run reads and sends until the file is read and every record sent is
// answered, or ctx ends.
func (r *replayer) run(ctx context.Context) error {
	var toSend []*item // read and to be sent, in file order
	eof := false
	lastProgress := r.t0
	for {
		if err := r.flush(); err != nil {
			return err
		}
		if now := time.Now(); r.o.Progress != nil && now.Sub(lastProgress) >= time.Second {
			lastProgress = now
			r.o.Progress(r.progress())
		}
		if ctx.Err() != nil {
			r.sum.Interrupted = true
			for _, it := range toSend {
				it.state = itemKeep
				r.sum.NotSent++
			}
			break
		}
		r.mu.Lock()
		inflight := r.inflight
		r.mu.Unlock()
		// Bounded: records waiting or in flight, and the lines held behind
		// the oldest unanswered one (however many lines of other topics).
		for !eof && len(toSend) < 500 && inflight+len(toSend) < r.o.InFlight && r.held() < maxHeld {
			line, long, n, err := r.readLine()
			if errors.Is(err, io.EOF) {
				eof = true
			} else if err != nil {
				return err
			}
			if n == 0 {
				break
			}
			it := long
			if it != nil {
				r.sum.TooLong++
			} else {
				it = r.classify(line)
			}
			r.mu.Lock()
			r.queue = append(r.queue, it)
			r.queued += len(it.line)
			r.mu.Unlock()
			if it.state == itemToSend {
				toSend = append(toSend, it)
			}
		}
		if len(toSend) == 0 {
			if eof && inflight == 0 {
				break
			}
			r.wait(ctx, time.Second) // for answers
			continue
		}
		if r.o.DryRun {
			for _, it := range toSend {
				it.state = itemAcked
				r.sum.Sent++
				r.sum.Topics[it.rec.Topic]++
			}
			toSend = toSend[:0]
			continue
		}
		n, wait := r.lim.take(time.Now(), len(toSend))
		if n == 0 {
			r.wait(ctx, wait)
			continue
		}
		if back := r.send(ctx, toSend[:n]); back > 0 {
			// Refused for now (the client's buffer, too many topics being
			// looked up): the same records again shortly.
			r.wait(ctx, back)
			continue
		}
		toSend = toSend[n:]
	}
	// Interrupted: what was sent gets Grace to be answered.
	deadline := time.Now().Add(r.o.Grace)
	for {
		r.mu.Lock()
		inflight := r.inflight
		r.mu.Unlock()
		if inflight == 0 || time.Now().After(deadline) {
			break
		}
		r.wait(context.Background(), time.Until(deadline))
	}
	return nil
}

// maxHeld bounds the bytes of the lines read and not yet settled.
const maxHeld = 64 << 20

func (r *replayer) held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queued
}

// wait sleeps up to d, less if an answer comes or ctx ends.
func (r *replayer) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.answered:
	case <-ctx.Done():
	}
}

// classify decodes one line: a record to send, or a line to keep.
func (r *replayer) classify(line []byte) *item {
	it := &item{line: line}
	rec, reason, _, err := Decode(bytes.TrimRight(line, "\r\n"))
	switch {
	case err != nil:
		r.sum.Unreadable++
	case r.o.Topic != "" && original(&rec) != r.o.Topic:
		r.sum.Skipped++
	default:
		original(&rec)
		if reason == "partition_unknown" {
			// Its partition is gone (the topic was created again with
			// fewer): sent again, it goes where its key or the
			// partitioner puts it, or it would be refused for good again.
			rec.SetPartition(-1)
		}
		it.rec, it.state = rec, itemToSend
		return it
	}
	it.state = itemKeep
	return it
}

// original restores a dead letter that was meant for the dead-letter
// topic and fell back to the file: its own topic (the header
// ferry.dead_letter.topic), partition (ferry.dead_letter.partition, if it
// had a chosen one) and headers. It returns the topic.
func original(r *record.Record) string {
	to := ""
	for _, h := range r.Headers {
		if h.Key == "ferry.dead_letter.topic" {
			to = string(h.Value)
		}
	}
	if to == "" {
		return r.Topic
	}
	hs := r.Headers[:0]
	for _, h := range r.Headers {
		switch {
		case h.Key == "ferry.dead_letter.partition":
			if p, err := strconv.ParseInt(string(h.Value), 10, 32); err == nil && p >= 0 {
				r.SetPartition(int32(p))
			}
		case !strings.HasPrefix(h.Key, "ferry.dead_letter."):
			hs = append(hs, h)
		}
	}
	r.Headers, r.Topic = hs, to
	return to
}

// send hands its records to Kafka as one batch; a positive duration means
// the batch was refused for now and should be sent again after it.
func (r *replayer) send(ctx context.Context, items []*item) time.Duration {
	b := &record.Batch{Records: make([]record.Record, len(items))}
	for i, it := range items {
		b.Records[i] = it.rec
		b.MemBytes += int64(it.rec.Size()) + record.Overhead
		it.state = itemInFlight
	}
	b.OnFailure = func(i int, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed {
			return
		}
		items[i].state = itemFailed
		r.sum.Failed[consumer.Reason(err)]++
		r.failed++
	}
	b.OnDone(func(error) {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		for _, it := range items {
			if it.state == itemInFlight {
				it.state = itemAcked
				r.sum.Sent++
				r.sum.Topics[it.rec.Topic]++
				r.sent++
			}
		}
		r.inflight -= len(items)
		r.mu.Unlock()
		select {
		case r.answered <- struct{}{}:
		default:
		}
	})
	r.mu.Lock()
	r.inflight += len(items)
	r.mu.Unlock()
	err := r.next.Consume(ctx, b)
	if err == nil {
		return 0
	}
	b.PopDone()
	r.mu.Lock()
	r.inflight -= len(items)
	r.mu.Unlock()
	var re *consumer.RetryableError
	if errors.As(err, &re) && !errors.Is(err, consumer.ErrShuttingDown) {
		for _, it := range items {
			it.state = itemToSend
		}
		return max(re.After, 100*time.Millisecond)
	}
	r.mu.Lock()
	for _, it := range items {
		it.state = itemFailed
	}
	r.sum.Failed[consumer.Reason(err)] += len(items)
	r.failed += len(items)
	r.mu.Unlock()
	return 0
}

// flush writes out, in order, the lines at the head of the queue whose
// fate is known, and drops those whose records Kafka acknowledged.
func (r *replayer) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := 0
	for ; i < len(r.queue); i++ {
		it := r.queue[i]
		if it.state == itemToSend || it.state == itemInFlight {
			break
		}
		if err := r.keep(it); err != nil {
			return err
		}
		r.queued -= len(it.line)
	}
	clear(r.queue[:i])
	r.queue = append(r.queue[:0], r.queue[i:]...)
	return nil
}

// keep writes the item's line to the new file unless Kafka has its record.
// Called with r.mu held.
func (r *replayer) keep(it *item) error {
	if it.state == itemAcked {
		return nil
	}
	r.sum.Kept++
	if r.w == nil {
		return nil
	}
	if it.long {
		if _, err := io.Copy(r.w, io.NewSectionReader(r.in, it.off, it.n)); err != nil {
			return err
		}
		if !it.nl {
			return r.w.WriteByte('\n') // a last line without its newline
		}
		return nil
	}
	line := it.line
	if line[len(line)-1] != '\n' {
		line = append(line, '\n') // a last line without its newline
	}
	_, err := r.w.Write(line)
	return err
}

// finish writes what is left — the lines still queued and, after an
// interruption, the rest of the file — and puts the new file in the old
// one's place (or removes the old one if nothing is left).
func (r *replayer) finish() error {
	defer func() {
		if r.o.Progress != nil {
			r.o.Progress(r.progress())
		}
	}()
	if r.o.DryRun {
		return nil
	}
	return r.replace()
}

func (r *replayer) replace() error {
	r.mu.Lock()
	r.closed = true
	for _, it := range r.queue {
		if it.state == itemInFlight {
			// Sent, not answered in time: it stays (Kafka may still have
			// it; a later replay may duplicate it, never lose it).
			r.sum.Unanswered++
			it.state = itemKeep
		}
		if err := r.keep(it); err != nil {
			r.mu.Unlock()
			return err
		}
	}
	r.queue = nil
	r.mu.Unlock()
	if r.sum.Interrupted {
		// The rest of the file, not read: as it is.
		for {
			line, long, n, err := r.readLine()
			if n > 0 {
				r.sum.NotSent++
				it := long
				if it == nil {
					it = &item{line: line}
				}
				if err := r.keep(it); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	err := r.w.Flush()
	if err == nil {
		err = r.out.Sync()
	}
	if cerr := r.out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing the dead letters left: %w (%s is unchanged)", err, r.o.File)
	}
	tmp := r.out.Name()
	r.out = nil
	if r.sum.Kept == 0 {
		_ = os.Remove(tmp)
		if err := os.Remove(r.o.File); err != nil {
			return fmt.Errorf("every dead letter is in Kafka, but %s could not be removed (a replay would send them again): %w", r.o.File, err)
		}
		r.sum.Removed = true
	} else if err := os.Rename(tmp, r.o.File); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("%s could not be replaced (it is unchanged: a replay would send its records again): %w", r.o.File, err)
	}
	if d, err := os.Open(filepath.Dir(r.o.File)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func (r *replayer) progress() ReplayProgress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ReplayProgress{Lines: r.sum.Lines, Sent: r.sent, Failed: r.failed, Skipped: r.sum.Skipped + r.sum.Unreadable,
		InFlight: r.inflight, Elapsed: time.Since(r.t0)}
}

// limiter paces the replay to rate records a second: a token bucket that
// starts with one token and holds at most a hundredth of a second's worth
// (at least one: burst), so that records go in batches of up to 10 ms
// worth. Over any stretch of t seconds it lets through at most
// burst + rate·t records (1 + rate·t from the start), and, when records
// keep waiting, at least rate·t − burst − 1.
type limiter struct {
	rate, burst, tokens float64
	at                  time.Time
}

func newLimiter(rate int, now time.Time) *limiter {
	return &limiter{rate: float64(rate), burst: max(1, float64(rate)/100), tokens: 1, at: now}
}

// take takes up to want tokens at now; with none to take it says how long
// until the next one.
func (l *limiter) take(now time.Time, want int) (n int, wait time.Duration) {
	if now.After(l.at) {
		l.tokens = min(l.burst, l.tokens+now.Sub(l.at).Seconds()*l.rate)
		l.at = now
	}
	// The epsilon forgives the float rounding of a refill that was meant
	// to make a whole token (the wait below, rounded up).
	n = min(want, int(l.tokens+1e-9))
	l.tokens -= float64(n)
	if n == 0 {
		wait = time.Duration(math.Ceil((1 - l.tokens) / l.rate * float64(time.Second)))
	}
	return n, wait
}
