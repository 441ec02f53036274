package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// clockWatch compares Redis's clock with this process's monotonic clock
// while the bench runs. Redis judges leases by its own (wall) clock, so a
// step of it (a time sync that jumps, a host paused and resumed) ends
// leases early or late: a Release then reports its lease lost, through no
// fault of the lock. The watch records such steps, so that an error they
// explain says so.
type clockWatch struct {
	mu    sync.Mutex
	steps []clockStep
	stop  chan struct{}
	done  chan struct{}
}

// A clockStep is a change of Redis's clock against the local monotonic
// one between two readings: by is how far it moved beyond what the
// readings' round trips allow for.
type clockStep struct {
	at time.Time
	by time.Duration
}

// clockStepMin is the least step the watch records: well above a busy
// machine's scheduling noise, well below a waiter TTL.
const clockStepMin = 250 * time.Millisecond

// watchClock starts reading Redis's clock every period through rdb.
func watchClock(rdb *redis.Client, period time.Duration) *clockWatch {
	w := &clockWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(period)
		defer t.Stop()
		var last reading
		for {
			if r, ok := read(rdb); ok {
				if !last.local.IsZero() {
					w.note(last, r)
				}
				last = r
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// A reading is Redis's clock read between local (monotonic) times local
// and local+rtt.
type reading struct {
	local time.Time
	rtt   time.Duration
	redis time.Time
}

func read(rdb *redis.Client) (reading, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	t0 := time.Now()
	r, err := rdb.Time(ctx).Result()
	if err != nil {
		return reading{}, false
	}
	return reading{local: t0, rtt: time.Since(t0), redis: r}, true
}

// note records a step between consecutive readings a and b: how much
// further Redis's clock moved than the local one.
func (w *clockWatch) note(a, b reading) {
	d := b.redis.Sub(a.redis) - b.local.Sub(a.local)
	slack := a.rtt + b.rtt
	if d.Abs() <= slack+clockStepMin {
		return
	}
	w.mu.Lock()
	w.steps = append(w.steps, clockStep{at: b.local, by: d})
	w.mu.Unlock()
}

// end stops the watch and describes the steps it saw ("" for none).
func (w *clockWatch) end() string {
	close(w.stop)
	<-w.done
	return w.report()
}

func (w *clockWatch) report() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.steps) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("Redis's clock stepped against this process's monotonic clock:")
	for _, s := range w.steps {
		sign := "+"
		if s.by < 0 {
			sign = ""
		}
		fmt.Fprintf(&b, " %s%v at %s;", sign, s.by.Round(time.Millisecond), s.at.Format("15:04:05.000"))
	}
	b.WriteString(" Redis judges leases by its clock, so leases then may have ended early (a Release reports its lease lost) or late.")
	return b.String()
}
