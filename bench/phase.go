package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/barrier"
)

// phaseParties is how many processes go through each round of the phase
// scenario.
const phaseParties = 8

// A phaseWay is one way to hold phaseParties processes at a phase's end
// until all have arrived: fairlock's cyclic barrier, or a counter that
// each arrival increments and every party polls.
type phaseWay struct {
	name, about string
	// arrive arrives at round r (counted from 0) for process i and
	// returns when the round is complete, or an error.
	arrive func(ctx context.Context, i int, p *proc, r int64) error
}

// phase is scenario 6c: phaseParties processes go through rounds of a
// phase, each round ending when the last of them arrives.
func phase(e *env) ([]*Table, []Target, error) {
	im, ok := e.own()
	if !ok {
		return nil, nil, nil
	}
	poll := func(every time.Duration) phaseWay {
		return phaseWay{
			name:  "INCR + GET polling every " + us(every),
			about: "each arrival INCRs the round's counter, then GETs it every " + us(every) + " until it reaches the parties",
			arrive: func(ctx context.Context, i int, p *proc, r int64) error {
				key := e.run + "phase-poll:" + strconv.FormatInt(r, 10)
				n, err := p.rdb.Incr(ctx, key).Result()
				if err != nil {
					return err
				}
				if n == 1 {
					if err := p.rdb.PExpire(ctx, key, time.Minute).Err(); err != nil {
						return err
					}
				}
				for n < phaseParties {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(every):
					}
					if n, err = p.rdb.Get(ctx, key).Int64(); err != nil {
						return err
					}
				}
				return nil
			},
		}
	}
	var bars sync.Map // process index → *barrier.Barrier
	ways := []phaseWay{
		{
			name:  im.name + " barrier",
			about: "barrier.Await: arrivals wait for a pushed wake-up",
			arrive: func(ctx context.Context, i int, p *proc, r int64) error {
				b, ok := bars.Load(i)
				if !ok {
					nb, err := barrier.New(p.locker.(*fairlockLocker).c, "phase", phaseParties)
					if err != nil {
						return err
					}
					b, _ = bars.LoadOrStore(i, nb)
				}
				_, err := b.(*barrier.Barrier).Await(ctx)
				return err
			},
		},
		poll(time.Millisecond),
		poll(100 * time.Microsecond),
	}
	t := &Table{Name: "phase", Title: fmt.Sprintf("6c. Phases: %d processes, each round ending when the last arrives", phaseParties),
		Note: "A cyclic barrier against the obvious hand-written alternative: a counter per round that every arrival INCRs and then polls with GET. " +
			"Redis CPU and commands are per arrival (a round is " + strconv.Itoa(phaseParties) + " arrivals); a round that breaks before the run's end is a failure.",
		Columns: []string{"way", "rounds/s", "Redis CPU per arrival", "commands per arrival (server)", "commands per arrival (clients)", "rounds broken"}}
	var targets []Target
	for _, w := range ways {
		cnt := &counter{}
		ps, closeAll, err := e.procs(im, phaseParties, cnt)
		if err != nil {
			return nil, nil, err
		}
		before := e.snap(cnt)
		rounds, arrivals, broken, elapsed, err := phaseRun(ps, e.cfg.duration, w)
		after := e.snap(cnt)
		closeAll()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", w.name, err)
		}
		cpu, server := "n/a (embedded)", "n/a"
		data := map[string]any{"way": w.name, "about": w.about, "rounds": rounds, "arrivals": arrivals, "seconds": elapsed.Seconds(), "broken": broken,
			"client_commands": after.client - before.client}
		if arrivals > 0 && before.cpuOK && after.cpuOK {
			v := (after.cpu - before.cpu) * 1e6 / float64(arrivals)
			cpu, data["cpu_us_per_arrival"] = fmt.Sprintf("%.1f µs", v), v
		}
		if arrivals > 0 && before.server >= 0 && after.server >= 0 {
			server, data["server_commands"] = perAcq(after.server-before.server, arrivals), after.server-before.server
		}
		t.Rows = append(t.Rows, []string{w.name, fmt.Sprintf("%.0f", float64(rounds)/elapsed.Seconds()), cpu, server,
			perAcq(after.client-before.client, arrivals), strconv.FormatInt(broken, 10)})
		t.Data = append(t.Data, data)
		targets = append(targets, Target{"phase", w.name + ": no round broken while every party runs", strconv.FormatInt(broken, 10), broken == 0 && rounds > 0, false})
	}
	return []*Table{t}, targets, nil
}

// phaseRun runs ps through rounds of w for about d: every process arrives
// at round 0, 1, 2... one after the other. It returns the rounds every
// party completed, the arrivals that returned complete, the rounds that
// broke before d ended (ErrBrokenBarrier before the run's end), and how
// long it ran. A process stops at its first error; one other than a
// broken round is returned.
func phaseRun(ps []*proc, d time.Duration, w phaseWay) (rounds, arrivals, broken int64, elapsed time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make([]int64, len(ps))
	errs := make([]error, len(ps))
	at := make([]int64, len(ps)) // the round of errs[i]
	start := time.Now()
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := int64(0); ; r++ {
				if err := w.arrive(ctx, i, p, r); err != nil {
					if ctx.Err() == nil {
						errs[i], at[i] = err, r
					}
					return
				}
				done[i]++
			}
		}()
	}
	wg.Wait()
	elapsed = time.Since(start)
	rounds = done[0]
	brokenAt := map[int64]bool{}
	for i, n := range done {
		arrivals += n
		rounds = min(rounds, n)
		switch {
		case errs[i] == nil:
		case errors.Is(errs[i], barrier.ErrBrokenBarrier):
			brokenAt[at[i]] = true
		default:
			return 0, 0, 0, 0, errs[i]
		}
	}
	return rounds, arrivals, int64(len(brokenAt)), elapsed, nil
}
