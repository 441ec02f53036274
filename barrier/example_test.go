package barrier_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
)

// Three workers step a simulation together, whichever process each runs
// in: none starts step k+1 before all three have finished step k. Then
// one worker gives up while another waits, breaking that round.
func Example() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	c, err := fairlock.New(rdb, fairlock.WithPrefix("myapp:"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	step, err := barrier.New(c, "sim-step", 3)
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	last := make([]int64, 3)
	for w := range 3 {
		wg.Go(func() {
			for range 2 {
				// ... compute this worker's part of the step ...
				a, err := step.Await(ctx) // blocks until all three arrive
				if err != nil {
					log.Print(err)
					return
				}
				last[w] = a.Round
			}
		})
	}
	wg.Wait()
	fmt.Println("rounds done by each worker:", last)

	// A worker whose context ends breaks the round for the others.
	arrived := func(n int) { // (for the example's order: n parties are in)
		for st, _ := step.Status(ctx); len(st.Arrived) < n; st, _ = step.Status(ctx) {
			time.Sleep(time.Millisecond)
		}
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := step.Await(ctx)
		waiting <- err
	}()
	arrived(1)
	giveUp, cancel := context.WithCancel(ctx)
	impatient := make(chan error, 1)
	go func() {
		_, err := step.Await(giveUp)
		impatient <- err
	}()
	arrived(2)
	cancel() // the impatient worker gives up
	fmt.Println("the impatient worker:", errors.Is(<-impatient, context.Canceled))
	err = <-waiting
	var broken *barrier.BrokenError
	fmt.Println("the waiting worker:", errors.Is(err, barrier.ErrBrokenBarrier), errors.As(err, &broken) && broken.Round == 3)
	st, err := step.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next round:", st.Round, "arrived:", len(st.Arrived))
	// Output:
	// rounds done by each worker: [2 2 2]
	// the impatient worker: true
	// the waiting worker: true true
	// next round: 4 arrived: 0
}
