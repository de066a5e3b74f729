package node

import (
	"time"

	"github.com/pagewarden/pagewarden/internal/sched"
)

// WrapExecutor makes Start wrap the engine's executor with wrap.
func WrapExecutor(o *Options, wrap func(sched.Executor) sched.Executor) {
	o.wrapExecutor = wrap
}

// SetStatsTimeout bounds how long a scrape waits for the scheduler loop.
func SetStatsTimeout(o *Options, d time.Duration) { o.statsTimeout = d }
