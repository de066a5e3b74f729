// Package resources says how much memory and CPU this process may use: the
// container's limits (cgroup v2) when it runs under them, else the host's.
// It reads files only; a file that cannot be read or parsed means "no
// limit known there", never an error, and the answer says where it came
// from so that a start-up line can tell the operator.
package resources

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
)

// Memory is the memory this process can still use, in bytes, and where
// the number came from. Bytes is 0 when nothing is known.
type Memory struct {
	Bytes  int64
	Source string // "cgroup memory.max - memory.current", "host MemAvailable", or "unknown"
}

// AvailableMemory reads the real file system.
func AvailableMemory() Memory { return availableMemory(os.DirFS("/")) }

// availableMemory is the smaller of what the cgroup still allows
// (memory.max - memory.current, cgroup v2) and the host's MemAvailable.
func availableMemory(root fs.FS) Memory {
	host, hostOK := hostAvailable(root)
	cg, cgOK := cgroupAvailable(root)
	switch {
	case cgOK && (!hostOK || cg < host):
		return Memory{Bytes: cg, Source: "cgroup memory.max - memory.current"}
	case hostOK:
		return Memory{Bytes: host, Source: "host MemAvailable"}
	}
	return Memory{Source: "unknown"}
}

func hostAvailable(root fs.FS) (int64, bool) {
	data, err := fs.ReadFile(root, "proc/meminfo")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil && kb >= 0 {
					return kb << 10, true
				}
			}
		}
	}
	return 0, false
}

// cgroupDir is this process's cgroup v2 directory under sys/fs/cgroup,
// from the "0::PATH" line of /proc/self/cgroup.
func cgroupDir(root fs.FS) (string, bool) {
	data, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return path.Join("sys/fs/cgroup", path.Clean("/" + p)[1:]), true
		}
	}
	return "", false
}

func cgroupAvailable(root fs.FS) (int64, bool) {
	dir, ok := cgroupDir(root)
	if !ok {
		return 0, false
	}
	read := func(name string) (int64, bool) {
		data, err := fs.ReadFile(root, path.Join(dir, name))
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		return v, err == nil && v >= 0 // "max" (no limit) does not parse
	}
	limit, ok := read("memory.max")
	if !ok {
		return 0, false
	}
	used, _ := read("memory.current")
	return max(limit-used, 0), true
}

// Threads is the default number of compute threads: GOMAXPROCS, which the
// Go runtime already derives from the container's CPU quota (cgroup
// cpu.max) and the process's CPU affinity.
func Threads() int { return runtime.GOMAXPROCS(0) }
