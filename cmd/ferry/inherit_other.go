//go:build !linux

package main

import (
	"os"
	"syscall"
)

// inheritConfig puts b in an unlinked temporary file that an exec keeps
// open (no close-on-exec), positioned at its start.
func inheritConfig(b []byte) (*os.File, error) {
	f, err := os.CreateTemp("", "ferry-config-*")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	// os.CreateTemp opens it close-on-exec: clear that.
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_SETFD, 0); e != 0 {
		f.Close()
		return nil, e
	}
	return f, nil
}
