package fltest

import (
	"cmp"
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook that counts the commands a client sends, a
// script call that ran under "script:<op>" (op: its first ARGV) whether it
// ran as EVALSHA, EVAL or FCALL (one that found no script or function, and
// so ran nothing, under its command's name), and the BLPOPs in flight at
// once.
type Counter struct {
	mu       sync.Mutex
	byName   map[string]int
	blocking int // BLPOPs in flight now
	peak     int // most BLPOPs in flight at once
}

// NewCounter returns a Counter that has counted nothing.
func NewCounter() *Counter { return &Counter{byName: map[string]int{}} }

// DialHook, ProcessPipelineHook and ProcessHook make Counter a redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		script := false
		if (name == "evalsha" || name == "eval" || name == "fcall") && len(cmd.Args()) > 3 {
			// Count script calls by op: the first ARGV after the keys.
			nkeys, _ := cmd.Args()[2].(int)
			if i := 3 + nkeys; i < len(cmd.Args()) {
				if op, ok := cmd.Args()[i].(string); ok {
					name, script = "script:"+op, true
				}
			}
		}
		if name == "blmpop" {
			name = "blpop" // counted as one kind: the blocking read
		}
		c.mu.Lock()
		if !script {
			c.byName[name]++
		}
		if name == "blpop" {
			c.blocking++
			c.peak = max(c.peak, c.blocking)
		}
		c.mu.Unlock()
		err := next(ctx, cmd)
		if name == "blpop" {
			c.mu.Lock()
			c.blocking--
			c.mu.Unlock()
		}
		if script {
			if e := cmp.Or(err, cmd.Err()); e != nil && (redis.HasErrorPrefix(e, "NOSCRIPT") ||
				strings.Contains(e.Error(), "Function not found") || strings.Contains(e.Error(), "unknown command") ||
				strings.Contains(e.Error(), "compiling script") && strings.Contains(e.Error(), "'#'")) {
				// It ran nothing (a server without the script, or one that
				// cannot read a script's "#!lua flags=" line); the client
				// sends it again.
				name = cmd.Name()
			}
			c.mu.Lock()
			c.byName[name]++
			c.mu.Unlock()
		}
		return err
	}
}

// Get returns how many commands name (see Counter) were sent.
func (c *Counter) Get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byName[name]
}

// Total returns how many commands were sent.
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.byName {
		n += v
	}
	return n
}

// Peak returns the most BLPOPs that were in flight at once.
func (c *Counter) Peak() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peak
}
