package spool

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// The recovery fuzz targets write a spool directory by hand (segments of
// honest frames, and the checkpoint or a segment header the fuzzer
// chose), open it, and check what Open made of it.

// fzNext is the Next of a spool that is never started.
type fzNext struct{}

func (fzNext) Consume(context.Context, *record.Batch) error {
	panic("spool fuzz: the reader was never started")
}

func fzConfig(dir string) Config {
	return Config{Dir: dir, SegmentBytes: 64 << 10, MaxBytes: 64 << 20, Fsync: "never", WriteBuffer: 1 << 20}
}

// fzFrames appends n small records sealed for f.
func fzFrames(dst []byte, f *segFormat, n int) []byte {
	for i := range n {
		dst = appendFrame(dst, &record.Record{Topic: "t", Value: []byte{'v', byte(i)}}, f)
	}
	return dst
}

// fzSegment is a segment of n honest frames.
func fzSegment(t testing.TB, n int) []byte {
	f, err := newSegFormat(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return fzFrames(f.header(), f, n)
}

// fzCheckpoint is a checkpoint file naming p, as writeCheckpoint writes it.
func fzCheckpoint(p pos) []byte {
	var b [28]byte
	copy(b[:], ckptMagic)
	binary.LittleEndian.PutUint64(b[8:], p.seg)
	binary.LittleEndian.PutUint64(b[16:], uint64(p.off))
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	return b[:]
}

// fzSegments is the segment ids on disk in dir, and their sizes.
func fzSegments(t *testing.T, dir string) ([]uint64, map[uint64]int64) {
	t.Helper()
	sizes := map[uint64]int64{}
	var ids []uint64
	for id := uint64(0); id < 16; id++ {
		if fi, err := os.Stat(filepath.Join(dir, segName(id))); err == nil {
			ids = append(ids, id)
			sizes[id] = fi.Size()
		}
	}
	return ids, sizes
}

// checkOpened: what recovery made of the directory is a position inside
// the data. The read position is the first segment left (every segment
// before it gone) at an offset of at least 0 (an offset past the
// segment's end is its end: nothing of it is left to read; one inside its
// header, its first frame), or with no segment left the new segment's
// start; the segment new appends go to is after every segment left; the
// segments Open knows are the files on disk, at their sizes; and the
// backlog is the data bytes from the read position on.
func checkOpened(t *testing.T, s *Spool, dir string) {
	t.Helper()
	ids, sizes := fzSegments(t, dir)
	if len(s.segs) != len(ids) {
		t.Fatalf("Open knows %d segments, %d on disk", len(s.segs), len(ids))
	}
	for _, id := range ids {
		if s.segs[id] != sizes[id] {
			t.Fatalf("segment %d: Open counts %d bytes, the file has %d", id, s.segs[id], sizes[id])
		}
	}
	if len(ids) == 0 {
		if s.rpos != (pos{s.wseg, segHeader}) {
			t.Fatalf("no segment left, and the read position is %+v (the next segment is %d)", s.rpos, s.wseg)
		}
		if s.Backlog() != 0 {
			t.Fatalf("no segment left, and a backlog of %d bytes", s.Backlog())
		}
		return
	}
	if s.rpos.seg != ids[0] || s.rpos.off < 0 {
		t.Fatalf("read position %+v, the first segment left is %d", s.rpos, ids[0])
	}
	if s.wseg <= ids[len(ids)-1] {
		t.Fatalf("new appends go to segment %d, not after segment %d", s.wseg, ids[len(ids)-1])
	}
	// Each segment counts from its own data start (8 bytes in the old
	// format), clamped at 0: a damaged segment shorter than its header
	// must not hide the others' bytes from buffer/spill (testdata/fuzz/
	// FuzzSegmentHeader: v1_backlog, short_segment_backlog, which failed
	// when every segment counted as its size less 32, unclamped).
	var want int64
	for _, id := range ids {
		start := segHeader
		if f, err := readSegFormat(filepath.Join(dir, segName(id))); err == nil && f.v1 {
			start = segHeaderV1
		}
		if id == s.rpos.seg {
			start = max(start, min(s.rpos.off, sizes[id]))
		}
		want += max(0, sizes[id]-start)
	}
	if got := s.Backlog(); got != want {
		t.Fatalf("backlog %d bytes, the segments hold %d from %+v", got, want, s.rpos)
	}
}

// FuzzCheckpoint: a checkpoint file of arbitrary bytes, or one that is
// well formed (its CRC right) and names an arbitrary position, beside
// zero, one or two segments of honest frames. readCheckpoint never
// panics, and takes exactly the well-formed files (28 bytes, magic, CRC)
// for the position they name; Open never fails on it; an unreadable
// checkpoint removes nothing and reads every segment from its start; a
// readable one removes exactly the segments before the one it names; and
// the result is a position inside the data (checkOpened). Closed and
// opened again, the spool keeps the same segments and position.
func FuzzCheckpoint(f *testing.F) {
	f.Add([]byte(nil), uint64(3), int64(40), uint8(0))                                    // a checkpoint inside the first segment
	f.Add([]byte(nil), uint64(4), int64(32), uint8(1<<1))                                 // the second segment
	f.Add([]byte(nil), uint64(9), int64(0), uint8(1<<1))                                  // past every segment
	f.Add([]byte(nil), uint64(3), int64(1<<40), uint8(1<<1))                              // past the segment's end
	f.Add([]byte(nil), uint64(3), int64(-5), uint8(0))                                    // a negative offset
	f.Add([]byte(nil), ^uint64(0), int64(0), uint8(2<<1))                                 // the last segment id there is, no segment
	f.Add(fzCheckpoint(pos{4, 60}), uint64(0), int64(0), uint8(1|1<<1))                   // well formed, as raw bytes
	f.Add(fzCheckpoint(pos{4, 60})[:27], uint64(0), int64(0), uint8(1))                   // torn
	f.Add([]byte("FRYCKPT1 not a checkpoint at all"), uint64(0), int64(0), uint8(1|1<<1)) // bad size
	f.Add([]byte(nil), uint64(0), int64(0), uint8(1<<3))                                  // no checkpoint file
	segs := [][]byte{fzSegment(f, 3), fzSegment(f, 5)}
	f.Fuzz(func(t *testing.T, raw []byte, seg uint64, off int64, mode uint8) {
		dir := t.TempDir()
		nsegs := int(mode>>1&3) % 3 // 0, 1 or 2 segments: 3 and 4
		for i := range nsegs {
			if err := os.WriteFile(filepath.Join(dir, segName(uint64(3+i))), segs[i], 0o600); err != nil {
				t.Fatal(err)
			}
		}
		ckpt := fzCheckpoint(pos{seg, off})
		if mode&1 == 1 {
			ckpt = raw
		}
		name := filepath.Join(dir, "checkpoint")
		if mode>>3&1 == 0 {
			if err := os.WriteFile(name, ckpt, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		before, _ := fzSegments(t, dir)

		cp, ok, err := readCheckpoint(name)
		wellFormed := mode>>3&1 == 0 && len(ckpt) == 28 && bytes.Equal(ckpt, fzCheckpoint(pos{binary.LittleEndian.Uint64(ckpt[8:]), int64(binary.LittleEndian.Uint64(ckpt[16:]))}))
		switch {
		case ok != wellFormed:
			t.Fatalf("readCheckpoint of %x: ok %v, well formed %v", ckpt, ok, wellFormed)
		case ok && err != nil:
			t.Fatalf("readCheckpoint: ok and %v", err)
		case ok && cp != (pos{binary.LittleEndian.Uint64(ckpt[8:]), int64(binary.LittleEndian.Uint64(ckpt[16:]))}):
			t.Fatalf("readCheckpoint of %x: %+v", ckpt, cp)
		case !ok && mode>>3&1 == 0 && err == nil:
			t.Fatalf("readCheckpoint of a malformed file (%x): no error", ckpt)
		}

		s, err := Open(fzConfig(dir), telemetry.TestSettings(), Links{Next: fzNext{}})
		if err != nil {
			t.Fatalf("Open with checkpoint %x: %v", ckpt, err)
		}
		after, _ := fzSegments(t, dir)
		want := before
		if ok {
			want = nil
			for _, id := range before {
				if id >= cp.seg {
					want = append(want, id)
				}
			}
		}
		if !slices.Equal(after, want) {
			s.Close()
			t.Fatalf("checkpoint %+v (readable %v): segments %v became %v, want %v", cp, ok, before, after, want)
		}
		if !ok && len(after) > 0 && s.rpos != (pos{after[0], 0}) {
			s.Close()
			t.Fatalf("an unreadable checkpoint, and reading starts at %+v, not segment %d's start", s.rpos, after[0])
		}
		checkOpened(t, s, dir)
		rpos := s.rpos
		s.Close()

		s, err = Open(fzConfig(dir), telemetry.TestSettings(), Links{Next: fzNext{}})
		if err != nil {
			t.Fatalf("Open again: %v", err)
		}
		defer s.Close()
		again, _ := fzSegments(t, dir)
		if !slices.Equal(again, after) {
			t.Fatalf("opened again, segments %v became %v", after, again)
		}
		if len(again) > 0 && s.rpos != rpos {
			t.Fatalf("opened again, the read position %+v became %+v", rpos, s.rpos)
		}
		checkOpened(t, s, dir)
	})
}

// FuzzSegmentHeader: the first 32 bytes of a segment are arbitrary, or a
// well-formed header (its CRC right) with an arbitrary frame limit, flags
// and secret; honest frames sealed for it (when it parses and they fit its
// limit) and arbitrary bytes follow. It is the newest segment (whose torn
// tail recovery cuts) or one in the middle. parseSegHeader never panics;
// what it takes it takes whole (a current header with a frame limit
// above 0, which written again parses the same); Open never fails on it;
// a newest segment without a header is removed, one with a header is cut
// at the end of a frame (or its header), never before the honest frames;
// a middle segment is left as it is (the reader skips a bad header's
// segment whole); and the result is a position inside the data
// (checkOpened).
func FuzzSegmentHeader(f *testing.F) {
	good, _ := newSegFormat(4096)
	f.Add(good.header(), []byte{}, uint8(0))
	f.Add(good.header(), []byte("torn tail"), uint8(1<<1))
	f.Add([]byte(segMagicV1), []byte("an old segment"), uint8(0))
	f.Add([]byte(segMagic), []byte{}, uint8(0))                                       // too short
	f.Add(append([]byte(segMagic), make([]byte, 24)...), []byte{}, uint8(0))          // bad CRC
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 2, 3, 4}, []byte{}, uint8(1)) // well formed: a huge limit, recycled
	f.Add([]byte{0, 0, 0, 0}, []byte{1}, uint8(1))                                    // well formed: no limit
	f.Add([]byte{12, 0, 0, 0}, []byte{}, uint8(1|1<<1))                               // well formed: a limit below the frames
	first := fzSegment(f, 2)
	last := fzSegment(f, 2)
	f.Fuzz(func(t *testing.T, hdr, tail []byte, mode uint8) {
		if mode&1 == 1 {
			// A well-formed header from the fuzzer's fields: frame limit,
			// flags, secret.
			var fl [16]byte
			copy(fl[:], hdr)
			h := make([]byte, segHeader)
			copy(h, segMagic)
			copy(h[8:24], fl[:])
			binary.LittleEndian.PutUint32(h[28:], crc32c(h[:28]))
			hdr = h
		}
		sf, herr := parseSegHeader(hdr)
		if herr == nil {
			switch {
			case sf.v1 && !bytes.HasPrefix(hdr, []byte(segMagicV1)):
				t.Fatalf("an old segment's header from %x", hdr)
			case !sf.v1 && (len(hdr) < int(segHeader) || sf.maxFrame <= 0 || crc32c(hdr[:28]) != binary.LittleEndian.Uint32(hdr[28:])):
				t.Fatalf("parseSegHeader took %x: %+v", hdr, sf)
			case !sf.v1:
				again, err := parseSegHeader(sf.header())
				if err != nil || again.maxFrame != sf.maxFrame || again.recycled != sf.recycled || again.secret != sf.secret ||
					again.tag != sf.tag || again.seed != sf.seed {
					t.Fatalf("header %x parses as %+v, written again as %+v (%v)", hdr, sf, again, err)
				}
			}
		}
		middle := mode>>1&1 == 1
		dir := t.TempDir()
		seg := append([]byte{}, hdr...)
		honest := 0
		if herr == nil && !sf.v1 && len(hdr) == int(segHeader) && sf.maxFrame >= 64 {
			seg = fzFrames(seg, sf, 3)
			honest = len(seg)
		}
		seg = append(seg, tail...)
		files := map[uint64][]byte{5: first, 6: seg}
		if middle {
			files[7] = last
		}
		for id, b := range files {
			if err := os.WriteFile(filepath.Join(dir, segName(id)), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// What the file's first bytes say, header and tail together.
		_, fileHerr := parseSegHeader(seg[:min(len(seg), int(segHeader))])
		s, err := Open(fzConfig(dir), telemetry.TestSettings(), Links{Next: fzNext{}})
		if err != nil {
			t.Fatalf("Open with segment header %x: %v", hdr, err)
		}
		defer s.Close()
		ids, sizes := fzSegments(t, dir)
		size, kept := sizes[6]
		switch {
		case middle:
			if !kept || size != int64(len(seg)) {
				t.Fatalf("a middle segment of %d bytes became %d (kept %v)", len(seg), size, kept)
			}
		case herr != nil && fileHerr != nil:
			if kept {
				t.Fatalf("the newest segment has no valid header (%v) and was kept (%d bytes)", herr, size)
			}
		case herr != nil:
			// A short header that the tail's bytes complete into a valid
			// one (the fuzzer found a checksum that matches): the file
			// does have a header, so keeping it is right; its frames are
			// the tail's, nothing honest to check.
		case !kept:
			t.Fatalf("the newest segment has a valid header and was removed")
		default:
			start := sf.dataStart()
			if size < start || size > int64(len(seg)) || size < int64(honest) {
				t.Fatalf("the newest segment of %d bytes (%d honest) cut to %d", len(seg), honest, size)
			}
			// The cut is at the end of a frame: the kept data scans to its
			// end with nothing skipped.
			fc := *sf
			if fc.v1 {
				fc.maxFrame = s.v1MaxFrame()
			}
			end := start
			scan(seg[start:size], true, &fc, func(o int, p []byte) bool {
				end = start + int64(o+fc.hdrLen()+len(p))
				return true
			})
			if end != size {
				t.Fatalf("the newest segment was cut at %d, its last frame ends at %d", size, end)
			}
		}
		if !slices.Contains(ids, 5) {
			t.Fatal("the first segment was removed")
		}
		checkOpened(t, s, dir)
	})
}
