package fairlock

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// The registry of hooked go-redis clients forgets a client once it is
// collected, so a program that makes go-redis clients again and again
// does not grow it.
func TestHookRegistryForgetsCollectedClients(t *testing.T) {
	var clients []weak.Pointer[redis.Client]
	var clusters []weak.Pointer[redis.ClusterClient]
	for range 10 {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
		for _, r := range []RedisClient{rdb, cc} {
			c, err := New(r)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.Close()
		}
		wr, wc := weak.Make(rdb), weak.Make(cc)
		hooked.mu.Lock()
		_, okr := hooked.clients[wr]
		_, okc := hooked.clusters[wc]
		hooked.mu.Unlock()
		if !okr || !okc {
			t.Fatalf("a go-redis client given to New is not registered (Client %v, ClusterClient %v)", okr, okc)
		}
		_ = rdb.Close()
		_ = cc.Close()
		clients, clusters = append(clients, wr), append(clusters, wc)
	}
	held := func() (n int) {
		hooked.mu.Lock()
		defer hooked.mu.Unlock()
		for _, wp := range clients {
			if _, ok := hooked.clients[wp]; ok {
				n++
			}
		}
		for _, wp := range clusters {
			if _, ok := hooked.clusters[wp]; ok {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for held() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the 20 go-redis clients still registered after they were dropped and the heap collected", held())
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
}

// The cost of watching a command: the hook on a command fairlock did not
// mark, and marking a command and the hook on it, under a context that
// cannot end and under one that can.
func BenchmarkDialWatchProcess(b *testing.B) {
	w := &dialWatch{waiting: make(map[uint64]context.CancelCauseFunc)}
	hook := w.ProcessHook(func(ctx context.Context, cmd redis.Cmder) error {
		select { // as go-redis does before it takes a pool turn
		case <-ctx.Done():
			return ctx.Err()
		default:
			return nil
		}
	})
	cmd := redis.NewCmd(context.Background(), "ping")
	deadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	d := new(dials)
	for _, bc := range []struct {
		name string
		ctx  context.Context
		mark bool
	}{
		{"unmarked", context.Background(), false},
		{"marked", context.Background(), true},
		{"marked-deadline", deadline, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx := bc.ctx
				if bc.mark {
					ctx = d.mark(ctx, nil)
				}
				_ = hook(ctx, cmd)
			}
		})
	}
}
