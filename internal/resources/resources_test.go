package resources

import (
	"testing"
	"testing/fstest"
)

func TestAvailableMemory(t *testing.T) {
	meminfo := &fstest.MapFile{Data: []byte("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   16000000 kB\n")}
	self := &fstest.MapFile{Data: []byte("0::/kubepods/pod1/ctr\n")}
	for _, tc := range []struct {
		name   string
		files  fstest.MapFS
		want   int64
		source string
	}{
		{"host only", fstest.MapFS{"proc/meminfo": meminfo}, 16000000 << 10, "host MemAvailable"},
		{"cgroup limit below the host", fstest.MapFS{"proc/meminfo": meminfo, "proc/self/cgroup": self,
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max":     {Data: []byte("4294967296\n")},
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.current": {Data: []byte("1073741824\n")}},
			3 << 30, "cgroup memory.max - memory.current"},
		{"cgroup without a limit", fstest.MapFS{"proc/meminfo": meminfo, "proc/self/cgroup": self,
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": {Data: []byte("max\n")}},
			16000000 << 10, "host MemAvailable"},
		{"cgroup above the host", fstest.MapFS{"proc/meminfo": meminfo, "proc/self/cgroup": self,
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": {Data: []byte("99999999999999\n")}},
			16000000 << 10, "host MemAvailable"},
		{"usage over the limit", fstest.MapFS{"proc/self/cgroup": self,
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max":     {Data: []byte("100\n")},
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.current": {Data: []byte("200\n")}},
			0, "cgroup memory.max - memory.current"},
		{"root cgroup", fstest.MapFS{"proc/self/cgroup": {Data: []byte("0::/\n")},
			"sys/fs/cgroup/memory.max": {Data: []byte("2048\n")}}, 2048, "cgroup memory.max - memory.current"},
		{"cgroup v1 only", fstest.MapFS{"proc/meminfo": meminfo, "proc/self/cgroup": {Data: []byte("12:memory:/x\n")}},
			16000000 << 10, "host MemAvailable"},
		{"nothing readable", fstest.MapFS{"proc/meminfo": {Data: []byte("garbage")}}, 0, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := availableMemory(tc.files)
			if got.Bytes != tc.want || got.Source != tc.source {
				t.Errorf("got %d (%s), want %d (%s)", got.Bytes, got.Source, tc.want, tc.source)
			}
		})
	}
}

func TestThreads(t *testing.T) {
	if Threads() < 1 {
		t.Fatal("no threads")
	}
}
