package boltstore

import (
	"os"
	"syscall"
)

// fdatasync flushes data without the metadata a preallocated file does not
// change.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
