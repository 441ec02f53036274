package election_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/redis/go-redis/v9"
)

// Two candidates, served in the order they campaigned; an observer sees
// each leader take office.
func Example() {
	mr, err := miniredis.Run() // a program would connect to its real Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// Each fairlock client stands for one process.
	var closers []func() error
	defer func() {
		for _, close := range closers {
			close()
		}
	}()
	newElection := func() *election.Election {
		c, err := fairlock.New(rdb)
		if err != nil {
			log.Fatal(err)
		}
		closers = append(closers, c.Close)
		e, err := election.New(c, "scheduler")
		if err != nil {
			log.Fatal(err)
		}
		return e
	}
	a, b := newElection(), newElection()

	octx, stopObserving := context.WithCancel(ctx)
	changes := a.Observe(octx)

	la, err := a.Campaign(ctx, "host-a:8080")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("observed:", (<-changes).Value)

	won := make(chan *election.Leadership)
	go func() {
		lb, err := b.Campaign(ctx, "host-b:8080") // waits behind host-a
		if err != nil {
			log.Fatal(err)
		}
		won <- lb
	}()

	info, err := b.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", info.Value)

	if err := la.Resign(ctx); err != nil { // host-b leads at once
		log.Fatal(err)
	}
	lb := <-won
	for info := range changes {
		if info.Term == lb.Term() {
			fmt.Println("observed:", info.Value, "with a higher term:", info.Term > la.Term())
			break
		}
	}
	stopObserving()
	_ = lb.Resign(ctx)
	// Output:
	// observed: host-a:8080
	// leader: host-a:8080
	// observed: host-b:8080 with a higher term: true
}
