package filereceiver

// copytruncate: logrotate's copytruncate copies app.log to app.log.1 and
// then truncates app.log in place. The lines written since ferry's last
// read (up to a poll_interval of them), and those read but not yet
// acknowledged, are no longer in app.log: they are only in the copy. So when
// ferry finds a file truncated, it looks in the file's directory for the
// copy — a file it does not know whose first bytes are the truncated
// file's fingerprint and which is at least as long as its committed offset — and
// reads it from that offset, as a rotated file of the same path (its lines
// before the new ones, the same path header and key). What stays lost is
// only what the writer added between the copy and the truncation, which
// no reader can see (docs/files.md). A copy outside the include globs is let
// go once read to its end; one inside them stays known by its inode, so it
// is never read again from its start.

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// maxCopyCandidates bounds the directory entries looked at for a copy.
const maxCopyCandidates = 4096

// recoverCopy adopts the copy of f, which was just found truncated; called
// before f forgets its old content.
func (r *Receiver) recoverCopy(f *file, now time.Time) {
	if len(f.fp) == 0 || f.cur == "" || f.gz {
		return
	}
	r.mu.Lock()
	from := f.committed
	r.mu.Unlock()
	dir := filepath.Dir(f.cur)
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(maxCopyCandidates)
	d.Close()
	var best string
	var bestID fileID
	var bestSize int64
	var bestMod time.Time
	for _, n := range names {
		p := filepath.Join(dir, n)
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() < from || int64(len(f.fp)) > fi.Size() {
			continue
		}
		id, ok := idOf(fi)
		if !ok || id == f.id || r.files[id] != nil {
			continue
		}
		fd, err := os.Open(p)
		if err != nil {
			continue
		}
		same := bytes.Equal(readPrefix(fd, len(f.fp), int64(len(f.fp))), f.fp)
		fd.Close()
		if same && (best == "" || fi.ModTime().After(bestMod)) {
			best, bestID, bestSize, bestMod = p, id, fi.Size(), fi.ModTime()
		}
	}
	if best == "" {
		return
	}
	g := r.adopt(f.path, best, f.group, bestID, bestSize, now,
		&entry{Path: f.path, FPLen: len(f.fp), FPHash: f.fpH, Offset: from})
	if g == nil {
		return
	}
	// Read once a checkpoint knows it, as any file new to ferry; older than
	// the truncated file's new content (truncated renumbers it).
	g.born = r.nextBorn()
	g.unsaved = true
	r.unsaved++
	g.seen = r.scanGen
	g.still = now
	if !r.matched(best) {
		r.setOrphan(g, true)
	} else {
		// It stays known under the globs; its lines still go before the
		// truncated file's new ones.
		g.first = true
		r.orphans = append(r.orphans, g)
	}
	r.fm.copies.Inc()
	r.log.Log(slog.LevelInfo, "copytruncate", "files: a truncated file's copy is read from the truncated file's committed offset",
		"path", f.path, "copy", best, "from_offset", from)
}

// matched: p is under the include globs and not excluded.
func (r *Receiver) matched(p string) bool {
	for _, pat := range r.cfg.Include {
		if ok, _ := filepath.Match(pat, p); ok {
			return !r.excluded(p)
		}
	}
	return false
}

// maxRotatedCandidates bounds the directory entries looked at per
// directory for files rotated since the checkpoint.
const maxRotatedCandidates = 4096

// adoptRotatedSince, at the first scan after a restart, reads the files
// rotated out of the globs since the checkpoint was written that the
// checkpoint does not know: a file that appeared and was renamed away
// while ferry was down, or after a checkpoint that could not be written
// (its disk full). Such a file is known by its name — a known file's name
// with a suffix, as logrotate names rotations (app.log.1, app.log-20261125,
// app.log.2.gz) — in a known file's directory, and by its modification
// time, at or after the checkpoint's. It is read from its first byte as a
// rotated file of that path (duplicates of what was sent before the
// crash, never a loss), before the path's current file.
func (r *Receiver) adoptRotatedSince(now time.Time) {
	type owner struct {
		path  string
		group int
	}
	dirs := map[string]map[string]owner{}
	add := func(path string, group int) {
		if path == "" {
			return
		}
		d := filepath.Dir(path)
		if dirs[d] == nil {
			dirs[d] = map[string]owner{}
		}
		dirs[d][filepath.Base(path)] = owner{path, group}
	}
	for _, f := range r.list {
		add(f.path, f.group)
	}
	for _, e := range r.saved {
		add(e.Path, 0)
	}
	since := r.ckptTime.Add(-time.Second)
	type candidate struct {
		p  string
		o  owner
		fi os.FileInfo
		id fileID
	}
	var found []candidate
	for dir, bases := range dirs {
		d, err := os.Open(dir)
		if err != nil {
			continue
		}
		names, _ := d.Readdirnames(maxRotatedCandidates)
		d.Close()
		for _, n := range names {
			var o owner
			for b, ow := range bases {
				if len(n) > len(b) && strings.HasPrefix(n, b) {
					o = ow
					break
				}
			}
			p := filepath.Join(dir, n)
			if o.path == "" || r.matched(p) {
				continue // not a rotation of a known file, or the scan's
			}
			fi, err := os.Lstat(p)
			if err != nil || !fi.Mode().IsRegular() || fi.ModTime().Before(since) {
				continue
			}
			id, ok := idOf(fi)
			if !ok || r.files[id] != nil {
				continue
			}
			found = append(found, candidate{p, o, fi, id})
		}
	}
	// Adopted oldest first (by last write), so that their generations, and
	// the order their lines go in, are the order they were written in.
	sort.Slice(found, func(i, j int) bool { return found[i].fi.ModTime().Before(found[j].fi.ModTime()) })
	for _, c := range found {
		f := r.adopt(c.o.path, c.p, c.o.group, c.id, c.fi.Size(), now, nil)
		if f == nil {
			continue
		}
		f.seen = r.scanGen
		r.setOrphan(f, true)
		f.still = now
		r.fm.rotatedSince.Inc()
		r.log.Log(slog.LevelWarn, "rotatedsince", "files: a file rotated since the last checkpoint, unknown to it, is read from its start (lines sent before the restart come again)",
			"path", c.o.path, "file", c.p)
	}
	if len(found) > 0 {
		// The paths' current files are younger than what was rotated out
		// of them, though found first in this scan.
		for _, f := range r.list {
			if !f.orphan && !f.first {
				f.born = r.nextBorn()
			}
		}
	}
}
