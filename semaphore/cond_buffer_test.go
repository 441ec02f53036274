package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// A bounded buffer shared by producers and consumers, each a client of its
// own (a process), guarded by one mutex with two conditions, "not full"
// and "not empty". Every critical section appends what it did to a log in
// Redis, under the mutex; an independent checker replays the log and
// finds: every item put once and taken once, in order; the buffer never
// over capacity; every Wait entered only when it had to, and ended by a
// Signal or Broadcast that found it waiting; every Signal that found
// waiters woke exactly one (the longest waiting), and one that found none
// woke none (so no waiter waits past a signal meant for it); the woken take
// the mutex in the order they were signalled.
func TestCondBoundedBuffer(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		const producers, consumers, perProducer, capacity = 3, 3, 15, 2
		total := producers * perProducer
		buf, taken, logKey := e.Prefix+"buf", e.Prefix+"taken", e.Prefix+"log"
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		type party struct {
			rdb  *redis.Client
			mu   *semaphore.Mutex
			full *semaphore.Cond // "not full"
			empt *semaphore.Cond // "not empty"
		}
		newParty := func() party {
			rdb := b.Client(t)
			c := e.ClientOn(rdb)
			mu, err := semaphore.NewMutex(c, "bb")
			if err != nil {
				t.Fatal(err)
			}
			full, err := semaphore.NewNamedCond(mu, "notfull")
			if err != nil {
				t.Fatal(err)
			}
			empt, err := semaphore.NewNamedCond(mu, "notempty")
			if err != nil {
				t.Fatal(err)
			}
			return party{rdb, mu, full, empt}
		}
		logf := func(p party, format string, args ...any) error {
			return p.rdb.RPush(ctx, logKey, fmt.Sprintf(format, args...)).Err()
		}

		produce := func(id int) error {
			p := newParty()
			for i := range perProducer {
				item := fmt.Sprintf("p%d-%d", id, i)
				lease, err := p.mu.Lock(ctx)
				for err == nil {
					var n int64
					if n, err = p.rdb.LLen(ctx, buf).Result(); err != nil || n < capacity {
						break
					}
					if err = logf(p, "wait P%d notfull", id); err == nil {
						lease, err = p.full.Wait(ctx, lease)
					}
					if err == nil {
						err = logf(p, "woke P%d notfull", id)
					}
				}
				if err != nil {
					return fmt.Errorf("producer %d: %w", id, err)
				}
				n, err := p.rdb.RPush(ctx, buf, item).Result()
				if err == nil {
					err = logf(p, "put %s %d", item, n)
				}
				var woken int
				if err == nil {
					woken, err = p.empt.Signal(ctx)
				}
				if err == nil {
					err = logf(p, "signal notempty %d", woken)
				}
				err = errors.Join(err, lease.Release(ctx))
				if err != nil {
					return fmt.Errorf("producer %d: %w", id, err)
				}
			}
			return nil
		}

		consume := func(id int) error {
			p := newParty()
			for {
				lease, err := p.mu.Lock(ctx)
				done := false
				for err == nil {
					var n, k int64
					n, err = p.rdb.LLen(ctx, buf).Result()
					if err == nil {
						k, err = p.rdb.IncrBy(ctx, taken, 0).Result()
					}
					if err != nil || n > 0 {
						break
					}
					if k == int64(total) {
						done = true
						break
					}
					if err = logf(p, "wait C%d notempty", id); err == nil {
						lease, err = p.empt.Wait(ctx, lease)
					}
					if err == nil {
						err = logf(p, "woke C%d notempty", id)
					}
				}
				if err == nil && done {
					err = logf(p, "exit C%d", id)
				}
				if err == nil && !done {
					var item string
					var k int64
					item, err = p.rdb.LPop(ctx, buf).Result()
					if err == nil {
						k, err = p.rdb.Incr(ctx, taken).Result()
					}
					if err == nil {
						err = logf(p, "take %s", item)
					}
					var woken int
					if err == nil {
						woken, err = p.full.Signal(ctx)
					}
					if err == nil {
						err = logf(p, "signal notfull %d", woken)
					}
					if err == nil && k == int64(total) {
						// The last item: the consumers still waiting stop.
						woken, err = p.empt.Broadcast(ctx)
						if err == nil {
							err = logf(p, "broadcast notempty %d", woken)
						}
					}
				}
				if lease != nil {
					err = errors.Join(err, lease.Release(ctx))
				}
				if err != nil || done {
					if err != nil {
						err = fmt.Errorf("consumer %d: %w", id, err)
					}
					return err
				}
			}
		}

		var wg sync.WaitGroup
		errs := make(chan error, producers+consumers)
		for i := range producers {
			wg.Go(func() { errs <- produce(i) })
		}
		for i := range consumers {
			wg.Go(func() { errs <- consume(i) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		entries, err := e.RDB.LRange(context.Background(), logKey, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := checkBuffer(entries, total, capacity, consumers); err != nil {
			t.Fatalf("%v\nlog:\n%s", err, strings.Join(entries, "\n"))
		}
		t.Logf("%d log entries; %d items through a buffer of %d", len(entries), total, capacity)
	})
}

// checkBuffer replays a bounded buffer's log (see TestCondBoundedBuffer).
func checkBuffer(entries []string, total, capacity, consumers int) error {
	var buffer []string              // the items in the buffer, in order
	seen := map[string]bool{}        // items ever put
	waiting := map[string][]string{} // condition -> who waits, in order
	var woken []string               // who was signalled, in order, not yet awake
	inWait := map[string]bool{}      // who is between "wait" and "woke"
	exits := 0
	for i, line := range entries {
		f := strings.Fields(line)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("entry %d %q: %s", i, line, fmt.Sprintf(format, args...))
		}
		switch f[0] {
		case "put":
			if seen[f[1]] {
				return bad("item put twice")
			}
			seen[f[1]] = true
			buffer = append(buffer, f[1])
			if n, _ := strconv.Atoi(f[2]); n != len(buffer) || n > capacity {
				return bad("buffer holds %d (the log says %d), capacity %d", n, len(buffer), capacity)
			}
		case "take":
			if len(buffer) == 0 || buffer[0] != f[1] {
				return bad("taken, but the buffer's head is %v", buffer)
			}
			buffer = buffer[1:]
		case "wait":
			who, cond := f[1], f[2]
			// Waiting only when it must: full for producers, empty for
			// consumers.
			if cond == "notfull" && len(buffer) < capacity || cond == "notempty" && len(buffer) > 0 {
				return bad("waits though the buffer holds %d", len(buffer))
			}
			if inWait[who] {
				return bad("waits twice")
			}
			inWait[who] = true
			waiting[cond] = append(waiting[cond], who)
		case "signal", "broadcast":
			cond := f[1]
			n, _ := strconv.Atoi(f[2])
			want := min(len(waiting[cond]), 1)
			if f[0] == "broadcast" {
				want = len(waiting[cond])
			}
			if n != want {
				return bad("woke %d; %d waited (%v)", n, len(waiting[cond]), waiting[cond])
			}
			woken = append(woken, waiting[cond][:n]...)
			waiting[cond] = waiting[cond][n:]
		case "woke":
			if len(woken) == 0 || woken[0] != f[1] {
				return bad("awake out of signal order (signalled, in order: %v)", woken)
			}
			woken = woken[1:]
			delete(inWait, f[1])
		case "exit":
			exits++
		default:
			return bad("unknown entry")
		}
	}
	switch {
	case len(seen) != total:
		return fmt.Errorf("%d items put, want %d", len(seen), total)
	case len(buffer) != 0:
		return fmt.Errorf("items left in the buffer: %v", buffer)
	case len(woken) != 0 || len(inWait) != 0:
		return fmt.Errorf("still waiting at the end: signalled %v, waiting %v", woken, slices.Sorted(maps.Keys(inWait)))
	case exits != consumers:
		return fmt.Errorf("%d consumers exited, want %d", exits, consumers)
	}
	return nil
}
