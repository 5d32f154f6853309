package filereceiver

// Compressed files (compression: gzip, or auto for names ending in .gz).
//
// A gzip file is read through a decompressor: its offsets (the
// ferry.file.offset header, the checkpoint) are positions in the
// decompressed text, and its size is the decompressed size, known once the
// whole file decompresses: a file still being written (its gzip trailer not
// there yet) is not read until it is complete. Its identity is its device,
// inode and first compressed bytes, like any file's.
//
// The usual way such a file appears is logrotate's compress: app.log is
// renamed to app.log.1, read to its end by ferry, and later replaced by
// app.log.1.gz, the same lines under a new inode. So that those lines are
// not sent twice, ferry remembers every file it read to its end and let
// go (up to maxDone of them, in the checkpoint): the length and hash of its
// first bytes, its size and a CRC-32C of its whole content. A gzip file
// whose decompressed first bytes and CRC over that size match one of them
// is read from that size on (usually nothing is left); a remembered file
// shorter than fingerprint_bytes matches only a gzip file of exactly its
// content, as its first bytes alone say too little to skip any. A gzip file found
// while a rotated file is still being drained waits for it to be let go
// first, so the match can be made. A copytruncate copy is not a file ferry
// let go (its lines were read from the original), so compressing it makes
// a file read again: exclude such files.

import (
	"compress/gzip"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"strings"
)

// maxDone bounds the files remembered as read to their end.
const maxDone = 1024

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// doneEntry is a file read to its end and let go.
type doneEntry struct {
	FPLen  int    `json:"fingerprint_bytes"`
	FPHash string `json:"fingerprint_sha256"`
	Size   int64  `json:"size"`
	CRC    uint32 `json:"crc32c"`
}

// isGzip: f is read through a decompressor.
func (r *Receiver) isGzip(path string) bool {
	switch r.cfg.Compression {
	case "gzip":
		return true
	case "auto":
		return strings.HasSuffix(path, ".gz")
	}
	return false
}

// gzSize is the decompressed size of f, whose file is zsize bytes on disk,
// through fd (or f.cur when nil). While the file does not decompress whole
// (still being written, or damaged) the size last known is kept, so what
// is there is not read before it is complete.
func (r *Receiver) gzSize(f *file, fd *os.File, zsize int64) int64 {
	if zsize == f.zsize || zsize == f.zTried {
		return f.size
	}
	if fd == nil {
		if fd = f.f; fd == nil {
			var err error
			if fd, err = os.Open(f.cur); err != nil {
				return f.size
			}
			defer fd.Close()
		}
	}
	zr, err := gzip.NewReader(io.NewSectionReader(fd, 0, zsize))
	var n int64
	if err == nil {
		n, err = io.Copy(io.Discard, zr)
	}
	if err != nil {
		f.zTried = zsize
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			r.m.Error("gzip_error")
			r.log.Log(slog.LevelError, "gzip", "files: a gzip file does not decompress; it is not read until it changes", "path", f.cur, "err", err)
		}
		return f.size
	}
	f.zsize = zsize
	// The file grew (another gzip member): a decompressor kept from before
	// has buffered the old end of file and would answer EOF there.
	f.zr = nil
	return n
}

// gzReadAt reads f's decompressed text at off, keeping the decompressor
// where it stopped: reads go forward, and only a rewind starts it again.
func (f *file) gzReadAt(buf []byte, off int64) (int, error) {
	if f.zr == nil || f.zpos > off {
		zr, err := gzip.NewReader(io.NewSectionReader(f.f, 0, 1<<62))
		if err != nil {
			return 0, err
		}
		f.zr, f.zpos = zr, 0
	}
	if skip := off - f.zpos; skip > 0 {
		n, err := io.CopyN(io.Discard, f.zr, skip)
		f.zpos += n
		if err != nil {
			return 0, err
		}
	}
	n, err := io.ReadFull(f.zr, buf)
	f.zpos += int64(n)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	if err != nil {
		// A gzip.Reader at its end answers EOF for good: should the file
		// grow, the next read starts again.
		f.zr = nil
	}
	return n, err
}

// remember records f, read to its end, as done (compression on only).
func (r *Receiver) remember(f *file) {
	if r.cfg.Compression == "none" || f.f == nil || f.gz || f.committed == 0 {
		return
	}
	h := crc32.New(castagnoli)
	if n, err := io.Copy(h, io.NewSectionReader(f.f, 0, f.committed)); err != nil || n != f.committed {
		return
	}
	fp := f.fp[:min(len(f.fp), int(f.committed))]
	r.finished = append(r.finished, doneEntry{FPLen: len(fp), FPHash: fpHash(fp), Size: f.committed, CRC: h.Sum32()})
	if len(r.finished) > maxDone {
		r.finished = append(r.finished[:0], r.finished[len(r.finished)-maxDone:]...)
	}
}

// decide finds where a gzip file not known from the checkpoint starts: past
// the lines of a file it is a compressed copy of, else at its start. It
// reports false while a rotated file is still being drained (it may be
// the one this is a copy of).
func (r *Receiver) decide(f *file) bool {
	for _, o := range r.orphans {
		if !o.gz && !o.released {
			return false
		}
	}
	f.decided = true
	if len(r.finished) == 0 || f.size == 0 {
		return true
	}
	prefix := make([]byte, min(int64(r.cfg.FingerprintBytes), f.size))
	if n, _ := f.gzReadAt(prefix, 0); n != len(prefix) {
		return true
	}
	for i := len(r.finished) - 1; i >= 0; i-- {
		d := r.finished[i]
		if d.Size > f.size || d.FPLen > len(prefix) || fpHash(prefix[:d.FPLen]) != d.FPHash {
			continue
		}
		if d.Size < int64(r.cfg.FingerprintBytes) && d.Size != f.size {
			// Shorter than a fingerprint, a file is known by nothing but
			// its whole content: a longer file that begins with it (a
			// banner line they share) is another file, not its copy.
			continue
		}
		h := crc32.New(castagnoli)
		if _, err := f.gzCopy(h, d.Size); err != nil || h.Sum32() != d.CRC {
			continue
		}
		r.mu.Lock()
		f.readOff, f.examined, f.committed = d.Size, d.Size, d.Size
		r.dirty = true
		r.mu.Unlock()
		r.fm.compressedCopies.Inc()
		r.log.Log(slog.LevelInfo, "gzcopy", "files: a gzip file holds the lines of a file already read; only what follows them is read",
			"path", f.cur, "skipped_bytes", d.Size)
		return true
	}
	return true
}

// gzCopy writes f's first n decompressed bytes to w.
func (f *file) gzCopy(w io.Writer, n int64) (int64, error) {
	zr, err := gzip.NewReader(io.NewSectionReader(f.f, 0, 1<<62))
	if err != nil {
		return 0, err
	}
	return io.CopyN(w, zr, n)
}
