package spool

// The reader: streaming segments to the exporter in budgeted chunks, and
// what happens to a chunk's records when Kafka answers.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/record"
)

// chunk is one read from a segment, delivered as one batch. Its buffer is
// the memory of its records until Kafka has answered for all of them.
type chunk struct {
	s   *Spool
	buf []byte
	// bufs: appends taken from the tail (tail.go), sent instead of buf
	// and given back to the appender's pool with the chunk.
	bufs     [][]byte
	reserved int64
	mark     *mark
	batch    record.Batch
	doneFn   func(error)
	failFn   func(int, error)
	dlNowFn  func(int, error) bool
	mu       sync.Mutex
	retry    []int
	dead     int
	tries    int
	// Dead letters not yet durable, and whether Kafka has answered for
	// every record: the chunk is finished when both are settled, by the
	// finisher (settling marks that it was handed over, exactly once).
	dlPending int
	kafkaDone bool
	settling  bool

	// Receipts (receipts in the store wait for Kafka): track says this
	// chunk follows where its records go; at[i] is record i's place in the
	// spool, bufAt the place of each tail buffer; rc is what the exporter
	// fills. All reused, so tracking allocates nothing once warm.
	track bool
	at    []receipt.Pos
	bufAt []pos
	rc    record.Receipt
}

// read is the reader goroutine: it streams the log from the watermark to
// the end, one budgeted chunk at a time, and waits at the end for appends.
func (s *Spool) read() {
	defer s.readWG.Done()
	if !s.resume() {
		return
	}
	for !s.readStop.Load() {
		s.mu.Lock()
		end, sealed := s.woff, false
		// The active segment's format, taken with its end: a roll and a
		// new segment may come before the next look.
		sf := s.wfmt.Load()
		if s.rpos.seg != s.wseg {
			end, sealed = s.segs[s.rpos.seg], true
		}
		s.armTail(sealed)
		nextSeg := s.wseg
		if sealed {
			for id := range s.segs {
				if id > s.rpos.seg && id < nextSeg {
					nextSeg = id
				}
			}
		}
		s.mu.Unlock()

		if sealed {
			var err error
			if sf, err = s.openSeg(s.rpos.seg); err != nil && !errors.Is(err, errSegHeader) {
				s.log.Log(slog.LevelError, "read", "spool segment not readable; retrying", "segment", segName(s.rpos.seg), "err", err)
				if !s.sleep(time.Second) {
					return
				}
				continue
			} else if err != nil {
				// No header we can trust: the frames cannot be told from
				// client bytes. The whole segment is damage.
				if s.rpos.off < end {
					s.m.corruptBytes.WithLabelValues("skipped").Add(float64(end - s.rpos.off))
					s.m.corruptRegions.Inc()
					s.logger.Warn("spool: segment with a damaged header skipped", "segment", segName(s.rpos.seg), "bytes", end-s.rpos.off, "err", err)
				}
				s.rpos.off = end
			}
		}
		if sf != nil && s.rpos.off < sf.dataStart() {
			s.rpos.off = sf.dataStart()
		}
		avail := end - s.rpos.off
		if avail <= 0 || !sealed && avail < int64(s.need) {
			if sealed {
				s.rpos = pos{nextSeg, 0}
				s.need = 0
				s.push(&mark{end: s.rpos, done: true})
				continue
			}
			select {
			case <-s.dataKick:
			case <-s.stopRead:
				return
			}
			continue
		}
		if !sealed && avail < int64(s.chunk) && !s.lingered {
			// Caught up with the writer: wait briefly for a fuller chunk
			// rather than send one per append (fewer, larger batches; the
			// exporter lingers anyway).
			s.lingered = true
			if !s.sleep(2 * time.Millisecond) {
				return
			}
			continue
		}
		s.lingered = false
		if ok, stop := s.readTail(); stop {
			return
		} else if ok {
			continue
		}
		size := min(avail, int64(max(s.chunk, s.need)))
		start := s.rpos
		c := s.chunks.Get().(*chunk)
		if int64(cap(c.buf)) < size {
			c.buf = make([]byte, size)
		}
		// The whole buffer is held, whatever this read fills of it; a
		// frame larger than the reader's whole budget (written under an
		// older, larger limit) takes all of it and overshoots by itself.
		held := min(int64(cap(c.buf)), s.ceiling)
		if !s.reserve(held) {
			s.chunks.Put(c)
			return
		}
		c.reserved = held
		if s.rpos.less(s.replayEnd) && !s.throttle(size) {
			s.release(c)
			return
		}
		n, err := s.readAt(c.buf[:size], s.rpos)
		if err != nil {
			s.log.Log(slog.LevelError, "read", "spool read failed; retrying", "segment", segName(s.rpos.seg), "err", err)
			s.release(c)
			if !s.sleep(time.Second) {
				return
			}
			continue
		}
		// A sealed segment ends at its size, or earlier if the file is
		// shorter than recorded (then the rest is damage).
		atEnd := sealed && (int64(n) >= avail || int64(n) < size)
		c.batch.Records = c.batch.Records[:0]
		c.track, c.at = s.links.Receipts.Watching(), c.at[:0]
		var bad, badFrames int64
		// Many tiny records cost more in structures than in bytes: stop the
		// chunk where they would take more than half the read-ahead.
		maxRecs := max(1, int((s.ceiling/2-c.reserved)/record.Overhead))
		stop, need, skipped, regions := scan(c.buf[:n], atEnd, sf, func(off int, p []byte) bool {
			if len(c.batch.Records) >= maxRecs {
				return false
			}
			if !s.decodeInto(c, p) {
				bad += int64(len(p) + sf.hdrLen())
				badFrames++
			} else if c.track {
				c.at = append(c.at, receipt.Pos{Seg: start.seg, Off: start.off + int64(off)})
			}
			return true
		})
		s.skipped(skipped+bad, regions+badFrames)
		s.need = need
		switch {
		case sf.v1 && skipped > 0:
			// An old segment cannot be resynchronised safely: the rest of
			// it was counted as damage.
			s.rpos.off = end
		case atEnd && stop >= n:
			s.rpos.off = end
		case stop == 0:
			// A frame larger than this read: read again with room for it.
			s.release(c)
			continue
		default:
			s.rpos.off += int64(stop)
		}
		if len(c.batch.Records) == 0 {
			s.release(c)
			s.push(&mark{end: s.rpos, done: true})
			continue
		}
		if start.less(s.replayEnd) {
			s.m.replayed.Add(float64(len(c.batch.Records)))
		}
		// Each record costs memory beyond its bytes in the buffer (ours and
		// the Kafka client's structures): take that too before sending.
		extra := int64(len(c.batch.Records) * record.Overhead)
		if !s.reserve(extra) {
			s.release(c)
			return
		}
		c.reserved += extra
		s.m.readBytes.WithLabelValues("disk").Add(float64(s.rpos.off - start.off))
		s.sendChunk(c)
	}
}

func (s *Spool) sendChunk(c *chunk) {
	c.batch.MemBytes = c.reserved
	c.batch.Spooled = true
	c.mark = &mark{end: s.rpos}
	c.batch.End = record.SpoolPos{Seg: s.rpos.seg, Off: s.rpos.off}
	s.push(c.mark)
	s.send(c)
}

// readTail sends the appends kept in memory that start at the read
// position as one chunk; ok if it did, stop if the reader is stopping.
func (s *Spool) readTail() (ok, stop bool) {
	c := s.chunks.Get().(*chunk)
	var end pos
	var n int
	c.bufs, c.bufAt, end, n, c.reserved = s.takeTail(c.bufs[:0], c.bufAt[:0], max(1, int(s.ceiling/2/record.Overhead)))
	if len(c.bufs) == 0 {
		s.chunks.Put(c)
		return false, false
	}
	var size int64
	for _, b := range c.bufs {
		size += int64(len(b))
	}
	extra := int64(n * record.Overhead)
	if !s.reserve(extra) {
		s.release(c)
		return false, true
	}
	c.reserved += extra
	c.batch.Records = c.batch.Records[:0]
	c.track, c.at = s.links.Receipts.Watching(), c.at[:0]
	s.skipped(s.framesOf(c))
	s.rpos, s.need = end, 0
	s.m.readBytes.WithLabelValues("memory").Add(float64(size))
	if len(c.batch.Records) == 0 {
		s.release(c)
		s.push(&mark{end: s.rpos, done: true})
		return true, false
	}
	s.sendChunk(c)
	return true, false
}

// decodeInto appends the record in payload p to c's batch; false if p
// does not decode (the caller counts it as damage).
func (s *Spool) decodeInto(c *chunk, p []byte) bool {
	c.batch.Records = append(c.batch.Records, record.Record{})
	var prev *record.Record
	if n := len(c.batch.Records); n > 1 {
		prev = &c.batch.Records[n-2]
	}
	if s.dec.decode(p, &c.batch.Records[len(c.batch.Records)-1], prev) != nil {
		c.batch.Records = c.batch.Records[:len(c.batch.Records)-1]
		return false
	}
	return true
}

// skipped counts and logs damaged bytes the reader skipped at its
// position, in regions stretches.
func (s *Spool) skipped(bytes, regions int64) {
	if bytes == 0 {
		return
	}
	s.m.corruptBytes.WithLabelValues("skipped").Add(float64(bytes))
	s.m.corruptRegions.Add(float64(regions))
	s.logger.Warn("spool: damaged bytes skipped; the intact records around them are delivered",
		"segment", segName(s.rpos.seg), "offset", s.rpos.off, "bytes", bytes)
}

var errSegHeader = errors.New("spool: damaged segment header")

// openSeg opens sealed segment id for reading and returns its format,
// read from its own header: its frame limit is the one it was written
// under, never the current config.
func (s *Spool) openSeg(id uint64) (*segFormat, error) {
	if s.rf != nil && s.rfSeg == id && s.rfFmt != nil {
		return s.rfFmt, nil
	}
	if _, err := s.readAt(nil, pos{id, 0}); err != nil {
		return nil, err
	}
	var hdr [segHeader]byte
	n, _ := s.rf.ReadAt(hdr[:], 0)
	f, err := parseSegHeader(hdr[:n])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errSegHeader, err)
	}
	if f.v1 {
		f.maxFrame = s.v1MaxFrame()
	}
	s.rfFmt = f
	return f, nil
}

func (s *Spool) readAt(buf []byte, p pos) (int, error) {
	if s.rf == nil || s.rfSeg != p.seg {
		if s.rf != nil {
			s.rf.Close()
			s.rf = nil
		}
		f, err := os.Open(s.path(segName(p.seg)))
		if err != nil {
			return 0, err
		}
		s.rf, s.rfSeg, s.rfFmt = f, p.seg, nil
	}
	n, err := s.rf.ReadAt(buf, p.off)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return n, err
}

// reserve takes size bytes of the memory budget, waiting for Kafka to
// acknowledge earlier chunks; false means the reader is stopping.
func (s *Spool) reserve(size int64) bool {
	for !s.budget.Reserve(size, s.ceiling) {
		select {
		case <-s.freeKick:
		case <-time.After(50 * time.Millisecond):
		case <-s.stopRead:
			return false
		}
	}
	return true
}

// throttle is a token bucket of ReplayRate bytes per second with one
// second of burst.
func (s *Spool) throttle(n int64) bool {
	rate := float64(s.cfg.ReplayRate)
	if rate <= 0 {
		return true
	}
	now := time.Now()
	if s.tokensAt.IsZero() {
		s.tokens = rate
	} else {
		s.tokens = min(rate, s.tokens+now.Sub(s.tokensAt).Seconds()*rate)
	}
	s.tokensAt = now
	s.tokens -= float64(n)
	if s.tokens >= 0 {
		return true
	}
	return s.sleep(time.Duration(-s.tokens / rate * float64(time.Second)))
}

func (s *Spool) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stopRead:
		return false
	}
}

func (s *Spool) send(c *chunk) {
	if c.track {
		// Sized to this send's records; the exporter fills it, finish
		// hands it to the store.
		n := len(c.batch.Records)
		c.rc.Topic, c.rc.Partition, c.rc.Offset = resize(c.rc.Topic, n), resize(c.rc.Partition, n), resize(c.rc.Offset, n)
		for i := range c.rc.Offset {
			c.rc.Offset[i] = -1
		}
		c.batch.Receipt = &c.rc
	}
	c.batch.OnFailure = c.failFn
	c.batch.DeadLetterNow = nil
	if s.links.DeadLetter != nil {
		c.batch.DeadLetterNow = c.dlNowFn
	}
	c.batch.OnDone(c.doneFn)
	if err := s.links.Next.Consume(context.Background(), &c.batch); err != nil {
		c.batch.PopDone()
		c.mu.Lock()
		c.retry = c.retry[:0]
		for i := range c.batch.Records {
			c.retry = append(c.retry, i)
		}
		c.mu.Unlock()
		c.onDone(err)
	}
}

// resize returns s with n zero elements, reusing its memory.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// onFailure sorts one failed record: dead letter for what retrying cannot
// fix, another try for everything else.
func (c *chunk) onFailure(i int, err error) {
	var pe *consumer.PermanentError
	if dl := c.s.links.DeadLetter; dl != nil && errors.As(err, &pe) {
		c.mu.Lock()
		c.dlPending++
		c.mu.Unlock()
		c.s.hand(finTask{c: c, i: i, err: err})
		return
	}
	c.mu.Lock()
	c.retry = append(c.retry, i)
	c.mu.Unlock()
}

// deadLettered settles record i's dead letter: counted as done once it is
// durable, sent again to Kafka if it could not be stored. It may run on
// the dead-letter topic's promise: finishing a chunk does no I/O there.
func (c *chunk) deadLettered(i int, err error) {
	if err == nil && c.track && i < len(c.at) {
		c.s.links.Receipts.DeadLettered(c.at[i])
	}
	c.mu.Lock()
	if err == nil {
		c.dead++
	} else {
		c.retry = append(c.retry, i)
	}
	c.dlPending--
	ready := c.dlPending == 0 && c.kafkaDone && !c.settling
	c.settling = c.settling || ready
	c.mu.Unlock()
	if ready {
		c.finish()
	}
}

// deadLetterNow stores record i's dead letter and waits until it is
// durable: for an exactly-once exporter, on its own goroutine (never the
// Kafka client's promise), which must know the dead letter is settled
// before it commits a position past the record. The record then counts
// as done when the exporter acknowledges it.
func (c *chunk) deadLetterNow(i int, err error) bool {
	var pe *consumer.PermanentError
	if !errors.As(err, &pe) {
		return false
	}
	done := make(chan error, 1)
	c.s.links.DeadLetter.Write(&c.batch.Records[i], pe.Reason, err, func(werr error) { done <- werr })
	if werr := <-done; werr != nil {
		return false
	}
	if c.track && i < len(c.at) {
		c.s.links.Receipts.DeadLettered(c.at[i])
	}
	c.mu.Lock()
	c.dead++
	c.mu.Unlock()
	return true
}

// onDone runs when Kafka has answered for every record of the batch, on
// the Kafka client's promise goroutine; the chunk finishes when its dead
// letters are settled too.
func (c *chunk) onDone(error) {
	c.mu.Lock()
	c.kafkaDone = true
	ready := c.dlPending == 0 && !c.settling
	c.settling = c.settling || ready
	c.mu.Unlock()
	if ready {
		c.finish()
	}
}

// finish runs when Kafka has answered for every record and every dead
// letter is settled: the chunk is done, or its failed records go again.
func (c *chunk) finish() {
	s := c.s
	if c.track {
		// Where Kafka put this round's records, for the receipts waiting
		// in the store: memory only, on the promise goroutine.
		s.links.Receipts.Settle(c.at, &c.rc)
	}
	c.mu.Lock()
	retry, dead := len(c.retry), c.dead
	c.dead = 0
	c.kafkaDone, c.settling = false, false
	c.mu.Unlock()
	if dead > 0 {
		s.m.deadLettered.Add(float64(dead))
	}
	if retry == 0 {
		s.m.delivered.Add(float64(len(c.batch.Records) - dead))
		s.ackMu.Lock()
		c.mark.done = true
		s.ackMu.Unlock()
		s.release(c)
		s.advance()
		return
	}
	s.m.delivered.Add(float64(len(c.batch.Records) - dead - retry))
	s.m.retried.Add(float64(retry))
	if s.readStop.Load() {
		// Stopping: the records stay in the spool (the watermark cannot
		// pass this chunk) and are replayed at the next start.
		s.release(c)
		return
	}
	c.tries++
	time.AfterFunc(backoff(c.tries), c.resend)
}

func backoff(tries int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < tries && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

// resend sends the records that failed again, from the same buffer.
func (c *chunk) resend() {
	s := c.s
	if s.readStop.Load() {
		s.release(c)
		return
	}
	c.mu.Lock()
	keep := make([]record.Record, len(c.retry))
	for j, i := range c.retry {
		keep[j] = c.batch.Records[i]
	}
	if c.track {
		// The records' places follow them into the next try.
		keepAt := make([]receipt.Pos, len(c.retry))
		for j, i := range c.retry {
			keepAt[j] = c.at[i]
		}
		c.at = append(c.at[:0], keepAt...)
	}
	c.retry = c.retry[:0]
	c.mu.Unlock()
	c.batch.Reset()
	c.batch.Records = append(c.batch.Records, keep...)
	c.batch.MemBytes = c.reserved
	c.batch.Spooled = true
	c.batch.End = record.SpoolPos{Seg: c.mark.end.seg, Off: c.mark.end.off}
	s.send(c)
}

// release gives a chunk's memory back and returns it to the pool. Only a
// chunk whose records are all answered (or abandoned at shutdown) goes.
func (s *Spool) release(c *chunk) {
	s.budget.Release(c.reserved)
	kick(s.freeKick)
	c.reserved = 0
	c.mark = nil
	c.batch.Reset()
	c.retry = c.retry[:0]
	c.dead, c.tries, c.dlPending, c.kafkaDone, c.settling = 0, 0, 0, false, false
	c.track, c.at, c.bufAt = false, c.at[:0], c.bufAt[:0]
	clear(c.rc.Topic)
	for i, b := range c.bufs {
		s.putBuf(b)
		c.bufs[i] = nil
	}
	c.bufs = c.bufs[:0]
	s.chunks.Put(c)
}
