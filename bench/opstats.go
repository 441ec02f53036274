package main

import (
	"fmt"
	"os"
	"sort"
	"sync"

	"github.com/redis/go-redis/v9"
)

// opStats, when BENCH_OPS is set, counts client commands by name and, for
// scripts, by their first argument (fairlock's op), and prints them at exit.
var opStats = func() *opCounter {
	if os.Getenv("BENCH_OPS") == "" {
		return nil
	}
	return &opCounter{n: map[string]int{}}
}()

type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *opCounter) note(cmd redis.Cmder) {
	args := cmd.Args()
	k := cmd.Name()
	if (k == "evalsha" || k == "eval" || k == "fcall") && len(args) > 2 {
		nk := fmt.Sprint(args[2])
		var n int
		fmt.Sscan(nk, &n)
		if len(args) > 3+n {
			k += " " + fmt.Sprint(args[3+n])
		}
	}
	o.mu.Lock()
	o.n[k]++
	o.mu.Unlock()
}

func (o *opCounter) print() {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	var ks []string
	for k := range o.n {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		fmt.Fprintf(os.Stderr, "ops: %s %d\n", k, o.n[k])
	}
}
