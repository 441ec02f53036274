package multilock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/multilock"
)

// A transfer locks both accounts at once. The names share the hash tag
// {acct}, so on Redis Cluster they live in one slot.
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
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lease, err := multilock.Lock(ctx, c, "{acct}:42", "{acct}:17")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	for _, p := range lease.Parts() {
		fmt.Println("locked", p.Name)
	}
	// Output:
	// locked {acct}:17
	// locked {acct}:42
}

// A job needs one of 2 GPUs and 4 of a database's 10 connections; it
// never holds a GPU while it waits for connections.
func ExampleAcquire() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	gpu := multilock.Request{Name: "{lab}:gpu", Capacity: 2, Permits: 1}
	db := multilock.Request{Name: "{lab}:db", Capacity: 10, Permits: 4}
	lease, err := multilock.Acquire(ctx, c, gpu, db)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	for _, p := range lease.Parts() {
		fmt.Printf("%s: %d of %d\n", p.Name, p.Permits, p.Capacity)
	}

	// Another job wants 7 connections: only 6 are free, so it gets
	// nothing, not even the free GPU.
	db.Permits = 7
	_, err = multilock.TryAcquire(ctx, c, gpu, db)
	fmt.Println(errors.Is(err, fairlock.ErrNotAcquired))
	// Output:
	// {lab}:db: 4 of 10
	// {lab}:gpu: 1 of 2
	// true
}
