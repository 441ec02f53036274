// Package listenhook lets fairlock's tests put go-redis hooks (fault
// injection, command counters) on the connections a fairlock Client opens
// for its blocking reads. Those connections belong to a go-redis client
// that fairlock builds from the caller's options, which carries none of the
// caller's hooks. It is internal: programs cannot reach it.
package listenhook

import (
	"sync"

	"github.com/redis/go-redis/v9"
)

var (
	mu    sync.Mutex
	hooks = map[any][]redis.Hook{}
)

// Add makes the blocking clients that fairlock builds from now on for rdb
// (a *redis.Client or *redis.ClusterClient) run h too. It returns a
// function that forgets h.
func Add(rdb any, h redis.Hook) (remove func()) {
	mu.Lock()
	defer mu.Unlock()
	hooks[rdb] = append(hooks[rdb], h)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		hs := hooks[rdb]
		for i, x := range hs {
			if x == h {
				hs = append(hs[:i:i], hs[i+1:]...)
				break
			}
		}
		if len(hs) == 0 {
			delete(hooks, rdb)
		} else {
			hooks[rdb] = hs
		}
	}
}

// For returns the hooks added for rdb, in the order they were added.
func For(rdb any) []redis.Hook {
	mu.Lock()
	defer mu.Unlock()
	return append([]redis.Hook(nil), hooks[rdb]...)
}
