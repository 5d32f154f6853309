// Package fileload is the load of the files receiver's proofs and
// benchmarks: N log files written at a fixed total rate, lines carrying a
// writer id and a sequence id (verify's id format: the file is the stream),
// rotated every few seconds by rename and create (logrotate's default) or
// by copytruncate, the rotated file optionally gzip'd; and a verifier that
// reads the topic back from Kafka and counts, per file, the lines lost,
// duplicated and out of order.
//
// It is a tool: the fault tests (proofs/faults) and ferry-bench suite both
// use it, and it uses neither.
package fileload

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/tools/bench/verify"
)

// Rotation is how the files are rotated.
type Rotation string

const (
	// NoRotation: the files only grow.
	NoRotation Rotation = "none"
	// Rename: the file is renamed to <name>.<n> and a new one created under
	// its name (logrotate's default, create).
	Rename Rotation = "rename"
	// CopyTruncate: the file is copied to <name>.<n> and then truncated
	// (logrotate's copytruncate); lines written between the end of the copy
	// and the truncation are in neither (the window, counted).
	CopyTruncate Rotation = "copytruncate"
)

// Spec says what to write.
type Spec struct {
	Dir      string
	Files    int
	Rate     int // lines per second over all files; 0: Lines of each file at once, as fast as the disk takes them
	LineSize int // bytes per line, without its newline (at least 24)
	// Lines, if > 0, ends each file after this many lines.
	Lines       int64
	Rotate      Rotation
	RotateEvery time.Duration
	// Gzip compresses each rotated file to <name>.<n>.gz and removes it.
	Gzip bool
	// Run is the producer id in every line (verify.NewProducerID() if "").
	Run string
}

// Glob matches the live files (rotated ones end in .<n> or .<n>.gz and
// do not match).
func (s Spec) Glob() string { return filepath.Join(s.Dir, "*.log") }

// Name is file i's live path.
func (s Spec) Name(i int) string { return filepath.Join(s.Dir, fmt.Sprintf("f%03d.log", i)) }

type file struct {
	mu   sync.Mutex
	path string
	f    *os.File
	seq  int64 // lines written
	n    int   // rotations
	// window: copytruncate's lost ranges [from, to) of sequence ids.
	window [][2]int64
}

// Writer is a running load.
type Writer struct {
	spec    Spec
	files   []*file
	pad     []byte
	cancel  context.CancelFunc
	done    chan struct{}
	rotated atomic.Int64
	gzipped atomic.Int64
	gz      sync.WaitGroup
	err     atomic.Pointer[error]
}

// filler is what pads a line: text, as applications log (compressible as
// their lines are, not a single repeated byte).
const filler = "GET /api/v1/orders?customer=4711&page=3 status=200 bytes=5123 ua=\"Mozilla/5.0 (X11; Linux x86_64)\" ref=https://shop.example/cart took=12.7ms "

// Start creates the files and writes until ctx ends, Stop is called, or
// every file has Lines lines.
func Start(ctx context.Context, spec Spec) (*Writer, error) {
	if spec.Files < 1 || spec.LineSize < 24 {
		return nil, fmt.Errorf("fileload: %d files, lines of %d bytes: want ≥ 1 file and lines ≥ 24 bytes", spec.Files, spec.LineSize)
	}
	if spec.Rate <= 0 && spec.Lines <= 0 {
		return nil, fmt.Errorf("fileload: neither a rate nor a number of lines")
	}
	if spec.Rotate == "" {
		spec.Rotate = NoRotation
	}
	if spec.Run == "" {
		spec.Run = verify.NewProducerID()
	}
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return nil, err
	}
	w := &Writer{spec: spec, done: make(chan struct{})}
	for len(w.pad) < spec.LineSize {
		w.pad = append(w.pad, filler...)
	}
	for i := 0; i < spec.Files; i++ {
		f, err := os.OpenFile(spec.Name(i), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		w.files = append(w.files, &file{path: spec.Name(i), f: f})
	}
	ctx, w.cancel = context.WithCancel(ctx)
	go w.run(ctx)
	return w, nil
}

// Spec is the spec the writer runs (with its Run id filled in).
func (w *Writer) Spec() Spec { return w.spec }

// appendLine writes file i's line seq into dst.
func (w *Writer) appendLine(dst []byte, i int, seq int64) []byte {
	n := len(dst)
	dst = verify.AppendSeq(dst, w.spec.Run, i, seq)
	dst = append(dst, w.pad[:max(0, w.spec.LineSize-(len(dst)-n))]...)
	return append(dst, '\n')
}

func (w *Writer) run(ctx context.Context) {
	defer close(w.done)
	// The rotator runs beside the writer, as logrotate beside a program:
	// copytruncate's copy races the writes, as it does there.
	if w.spec.Rotate != NoRotation && w.spec.RotateEvery > 0 {
		rctx, stop := context.WithCancel(ctx)
		rdone := make(chan struct{})
		go w.rotator(rctx, rdone)
		defer func() { stop(); <-rdone }()
	}
	const tick = 10 * time.Millisecond
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	start := time.Now()
	var written int64
	next := 0 // the file that gets the next line, round-robin
	buf := make([]byte, 0, 64<<10)
	for {
		var due int64
		if w.spec.Rate > 0 {
			due = int64(time.Since(start).Seconds()*float64(w.spec.Rate)) - written
		} else {
			due = 4096 * int64(len(w.files))
		}
		if w.spec.Lines > 0 {
			due = min(due, w.spec.Lines*int64(len(w.files))-written)
		}
		// Each file takes its share of the due lines in one write.
		per := make([]int64, len(w.files))
		for k := int64(0); k < due; k++ {
			per[next]++
			next = (next + 1) % len(w.files)
		}
		for i, n := range per {
			if n == 0 {
				continue
			}
			f := w.files[i]
			f.mu.Lock()
			buf = buf[:0]
			for k := int64(0); k < n; k++ {
				buf = w.appendLine(buf, i, f.seq+k)
			}
			if _, err := f.f.Write(buf); err != nil {
				f.mu.Unlock()
				w.fail(err)
				return
			}
			f.seq += n
			f.mu.Unlock()
			written += n
		}
		if w.spec.Lines > 0 && written >= w.spec.Lines*int64(len(w.files)) {
			return
		}
		if w.spec.Rate <= 0 {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// rotator rotates every file each RotateEvery until ctx ends.
func (w *Writer) rotator(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(w.spec.RotateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i := range w.files {
			if err := w.rotate(i); err != nil {
				w.fail(err)
				return
			}
		}
		w.rotated.Add(1)
	}
}

func (w *Writer) fail(err error) { w.err.CompareAndSwap(nil, &err) }

// rotate rotates file i the spec's way.
func (w *Writer) rotate(i int) error {
	f := w.files[i]
	f.mu.Lock()
	f.n++
	old := fmt.Sprintf("%s.%d", f.path, f.n)
	f.mu.Unlock()
	switch w.spec.Rotate {
	case Rename:
		f.mu.Lock()
		if err := os.Rename(f.path, old); err != nil {
			f.mu.Unlock()
			return err
		}
		nf, err := os.OpenFile(f.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			f.mu.Unlock()
			return err
		}
		f.f.Close()
		f.f = nf
		f.mu.Unlock()
	case CopyTruncate:
		// As logrotate: copy while the writer goes on, then truncate. Lines
		// written after the copy's last read and before the truncation are
		// in neither file.
		last, err := copyFile(f.path, old)
		if err != nil {
			return err
		}
		f.mu.Lock()
		if err := f.f.Truncate(0); err != nil {
			f.mu.Unlock()
			return err
		}
		if last+1 < f.seq {
			f.window = append(f.window, [2]int64{last + 1, f.seq})
		}
		f.mu.Unlock()
	}
	if w.spec.Gzip {
		w.gz.Add(1)
		go func() {
			defer w.gz.Done()
			if err := gzipFile(old); err != nil {
				w.fail(err)
				return
			}
			w.gzipped.Add(1)
		}()
	}
	return nil
}

// copyFile copies src to dst and returns the sequence id of the last whole
// line copied (-1 if none).
func copyFile(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return -1, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return -1, err
	}
	defer out.Close()
	var tail []byte
	buf := make([]byte, 256<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				return -1, werr
			}
			tail = append(tail[:0], lastLines(append(tail, buf[:n]...))...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return -1, err
		}
	}
	// The last whole line: the copy may end inside a line being written.
	end := bytes.LastIndexByte(tail, '\n')
	if end < 0 {
		return -1, nil
	}
	start := bytes.LastIndexByte(tail[:end], '\n') + 1
	_, _, seq, ok := verify.ParseSeq(tail[start:end])
	if !ok {
		return -1, fmt.Errorf("fileload: the copy of %s does not end in a load line", src)
	}
	return seq, nil
}

// lastLines keeps the end of b: enough for the last two lines.
func lastLines(b []byte) []byte {
	const keep = 64 << 10
	if len(b) > keep {
		return b[len(b)-keep:]
	}
	return b
}

func gzipFile(path string) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(path + ".gz")
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(out)
	if _, err := io.Copy(zw, in); err != nil {
		out.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Remove(path)
}

// Done is closed once the writer has stopped (Lines reached, ctx ended,
// Stop, or an error).
func (w *Writer) Done() <-chan struct{} { return w.done }

// Stop ends the load and waits for it; it returns the first write or
// rotation error.
func (w *Writer) Stop() error {
	w.cancel()
	<-w.done
	w.gz.Wait()
	for _, f := range w.files {
		f.mu.Lock()
		f.f.Close()
		f.mu.Unlock()
	}
	if e := w.err.Load(); e != nil {
		return *e
	}
	return nil
}

// Written is how many lines each file got (ids 0..n-1).
func (w *Writer) Written() []int64 {
	out := make([]int64, len(w.files))
	for i, f := range w.files {
		f.mu.Lock()
		out[i] = f.seq
		f.mu.Unlock()
	}
	return out
}

// Total is the lines written over all files.
func (w *Writer) Total() int64 {
	var n int64
	for _, v := range w.Written() {
		n += v
	}
	return n
}

// Rotations is how many times the files were rotated (each time, all).
func (w *Writer) Rotations() int64 { return w.rotated.Load() }

// Windows is, per file, copytruncate's ranges of ids written after the copy
// and before the truncation: no agent can be blamed for losing them unless
// it had read them already.
func (w *Writer) Windows() [][][2]int64 {
	out := make([][][2]int64, len(w.files))
	for i, f := range w.files {
		f.mu.Lock()
		out[i] = append([][2]int64(nil), f.window...)
		f.mu.Unlock()
	}
	return out
}

// WindowLines counts the ids in the copytruncate windows.
func (w *Writer) WindowLines() int64 {
	var n int64
	for _, ws := range w.Windows() {
		for _, r := range ws {
			n += r[1] - r[0]
		}
	}
	return n
}

// Describe is the load in words, for tables.
func (s Spec) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d files, %d B lines", s.Files, s.LineSize)
	if s.Rate > 0 {
		fmt.Fprintf(&b, ", %d lines/s", s.Rate)
	}
	if s.Rotate != NoRotation && s.Rotate != "" {
		fmt.Fprintf(&b, ", %s every %s", s.Rotate, s.RotateEvery)
		if s.Gzip {
			b.WriteString(" + gzip")
		}
	}
	return b.String()
}
