//go:build !unix

package link

import "time"

func cpuTime() time.Duration { return 0 }
