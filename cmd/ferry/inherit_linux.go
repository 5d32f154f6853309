package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// inheritConfig puts b in an anonymous in-memory file that an exec keeps
// open (no close-on-exec), positioned at its start.
func inheritConfig(b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("ferry-config", 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "ferry-config")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
