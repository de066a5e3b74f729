package gguf

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Open memory-maps the file at path read-only and parses it. Tensor data
// stays in the mapping (pages are read on first touch); Close unmaps it.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close() // the mapping outlives the descriptor
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size == 0 {
		return nil, fmt.Errorf("%s: %w", path, errf(ErrNotGGUF, "file is empty"))
	}
	if size < 0 || size != int64(int(size)) {
		return nil, fmt.Errorf("%s: %w", path, errf(ErrLimit, "file size %d cannot be mapped", size))
	}
	data, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gguf: mmap %s: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		_ = unix.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.unmap = func() error { return unix.Munmap(data) }
	return f, nil
}
