package fileload

import (
	"bufio"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readAll feeds every line of every file in dir (rotated, gzip'd too) to c.
func readAll(t *testing.T, dir string, c *Counter) {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	// In writing order: a file's rotated copies by number, then the file.
	order := func(n string) (string, int) {
		base, rest, _ := strings.Cut(filepath.Base(n), ".log")
		k, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rest, "."), ".gz"))
		if err != nil {
			k = 1 << 30
		}
		return base, k
	}
	sort.Slice(names, func(i, j int) bool {
		bi, ki := order(names[i])
		bj, kj := order(names[j])
		return bi < bj || bi == bj && ki < kj
	})
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			t.Fatal(err)
		}
		var r io.Reader = f
		if strings.HasSuffix(n, ".gz") {
			zr, err := gzip.NewReader(f)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.Add(sc.Bytes())
		}
		f.Close()
	}
}

func TestRotationKeepsEveryLine(t *testing.T) {
	for _, tc := range []struct {
		rot  Rotation
		gzip bool
	}{{Rename, false}, {Rename, true}, {CopyTruncate, false}, {NoRotation, false}} {
		t.Run(string(tc.rot), func(t *testing.T) {
			dir := t.TempDir()
			w, err := Start(context.Background(), Spec{Dir: dir, Files: 3, Rate: 30000, LineSize: 100, Rotate: tc.rot, RotateEvery: 150 * time.Millisecond, Gzip: tc.gzip})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
			if err := w.Stop(); err != nil {
				t.Fatal(err)
			}
			total := w.Total()
			if total < 15000 || total > 40000 {
				t.Fatalf("%d lines in 1 s at 30,000/s", total)
			}
			if tc.rot != NoRotation && w.Rotations() < 3 {
				t.Fatalf("%d rotations in 1 s every 150 ms", w.Rotations())
			}
			c := NewCounter(w.Spec().Run, w.Written(), w.Windows())
			readAll(t, dir, c)
			r := c.Result()
			t.Logf("%s: %s, %d rotations", tc.rot, r, w.Rotations())
			if r.Duplicated != 0 || r.Foreign != 0 || r.OutOfOrder != 0 {
				t.Fatalf("the files hold %s", r)
			}
			if r.Lost != r.LostInWindow {
				t.Fatalf("%d lines missing from the files outside copytruncate's windows", r.Lost-r.LostInWindow)
			}
			if tc.rot != CopyTruncate && r.Lost != 0 {
				t.Fatalf("%d lines missing", r.Lost)
			}
			if tc.gzip {
				gz, _ := filepath.Glob(filepath.Join(dir, "*.gz"))
				if len(gz) == 0 {
					t.Fatal("no rotated file was gzip'd")
				}
			}
		})
	}
}

func TestBacklogAndLineSize(t *testing.T) {
	dir := t.TempDir()
	w, err := Start(context.Background(), Spec{Dir: dir, Files: 2, Lines: 1000, LineSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(w.Spec().Name(1))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 1000*101 {
		t.Fatalf("file of %d bytes, want 1000 lines of 100 B and a newline", fi.Size())
	}
	c := NewCounter(w.Spec().Run, w.Written(), nil)
	readAll(t, dir, c)
	c.Add([]byte("not a load line"))
	c.Add(nil)
	if r := c.Result(); r.Delivered != 2000 || r.Lost != 0 || r.Foreign != 2 {
		t.Fatalf("%s", r)
	}
}

func TestCounterCountsLossDupsOrder(t *testing.T) {
	w := &Writer{spec: Spec{Run: "abc", LineSize: 30}, pad: []byte(strings.Repeat("x", 30))}
	line := func(f int, seq int64) []byte {
		return []byte(strings.TrimSuffix(string(w.appendLine(nil, f, seq)), "\n"))
	}
	c := NewCounter("abc", []int64{5, 3}, [][][2]int64{{{3, 4}}})
	for _, s := range []int64{0, 2, 1, 2, 4} { // file 0: 3 lost (in the window), 1 late, 2 twice
		c.Add(line(0, s))
	}
	c.Add([]byte(`"` + string(line(1, 0)) + `"`)) // as the Collector's raw encoding writes it
	r := c.Result()
	if r.Delivered != 5 || r.Lost != 3 || r.LostInWindow != 1 || r.Duplicated != 1 || r.OutOfOrder != 1 || r.PerFileLost[1] != 2 {
		t.Fatalf("%+v", r)
	}
}
