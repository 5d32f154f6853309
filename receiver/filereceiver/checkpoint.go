package filereceiver

// The checkpoint: every known file's identity and committed offset, in one
// small JSON file replaced atomically.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

const (
	checkpointName    = "checkpoints.json"
	checkpointVersion = 1
)

// entry is one file in the checkpoint. The fingerprint is kept as the
// length and hash of the file's first bytes: enough to recognise the file
// again, and small for thousands of files.
type entry struct {
	// Path is where the file was first seen (its headers and key say so
	// after a rotation too); Current where it was last seen.
	Path    string `json:"path"`
	Current string `json:"current,omitempty"`
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	FPLen   int    `json:"fingerprint_bytes"`
	FPHash  string `json:"fingerprint_sha256"`
	Offset  int64  `json:"offset"`
	// Born orders the files ferry found (a new file, a truncated file's
	// new content, a copy): a path's older generations have smaller
	// numbers, so its rotated files are read oldest first after a restart
	// too. 0 (a checkpoint written before it was kept): older than any
	// file found since, unordered among themselves.
	Born uint64 `json:"born,omitempty"`
}

type checkpointDoc struct {
	Version int     `json:"version"`
	Files   []entry `json:"files"`
	// Done are files read to their end and let go (compression on).
	Done []doneEntry `json:"done,omitempty"`
}

func fpHash(fp []byte) string {
	h := sha256.Sum256(fp)
	return hex.EncodeToString(h[:])
}

// lockDir takes the checkpoint directory for this process alone.
func lockDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	lf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lf.Close()
		return nil, fmt.Errorf("%s is in use by another ferry process (%v)", dir, err)
	}
	return lf, nil
}

// loadCheckpoint reads dir's checkpoint. found is false when there is none
// (the first start). A damaged checkpoint is moved aside to
// checkpoints.json.bad and reported in err, with found true: ferry then
// reads every file from its first byte (duplicates rather than loss).
func loadCheckpoint(dir string) (doc checkpointDoc, found bool, err error) {
	p := filepath.Join(dir, checkpointName)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return doc, false, nil
	}
	if err != nil {
		return doc, true, err
	}
	if err = json.Unmarshal(data, &doc); err == nil && doc.Version != checkpointVersion {
		err = fmt.Errorf("version %d, not %d", doc.Version, checkpointVersion)
	}
	if err != nil {
		_ = os.Rename(p, p+".bad")
		return checkpointDoc{}, true, fmt.Errorf("%s is damaged (%v); moved to %s.bad, every file is read from its start", p, err, checkpointName)
	}
	return doc, true, nil
}

// writeCheckpoint replaces dir's checkpoint: a temporary file, fsync'd,
// renamed over the old one, and the directory fsync'd, so a crash leaves
// the old checkpoint or the new one, never a mix.
func writeCheckpoint(dir string, entries []entry, done []doneEntry) error {
	data, err := json.Marshal(checkpointDoc{Version: checkpointVersion, Files: entries, Done: done})
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, checkpointName+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, checkpointName)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
