package fairlockrueidis_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockrueidis"
	"github.com/redis/rueidis"
)

// A Client on a rueidis client takes and releases a lease as one made on
// go-redis does.
func ExampleNew() {
	mr, err := miniredis.Run() // a program connects to its own Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{mr.Addr()},
		DisableCache: true, // miniredis has no client-side caching
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()

	c, err := fairlockrueidis.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx := context.Background()
	l, err := c.Acquire(ctx, fairlock.Request{Name: "reports", Capacity: 2, Permits: 1})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held", l.Permits(), "of", l.Name(), "with a fencing token:", l.Token() > 0)
	if err := l.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: held 1 of reports with a fencing token: true
}
