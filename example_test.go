package fairlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// The engine's own API takes a Request; package semaphore wraps it.
func ExampleClient_Acquire() {
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
	lease, err := c.Acquire(ctx, fairlock.Request{Name: "reports", Capacity: 2, Permits: 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Name(), lease.Permits(), lease.Token() > 0)
	fmt.Println(lease.Release(ctx), lease.Err())
	// Output:
	// reports 2 true
	// <nil> fairlock: lease not held
}
