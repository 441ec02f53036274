// Command quickstart is the README's quickstart: it caps concurrent
// encoders at four across every process that runs it.
package main

import (
	"context"
	"log"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

func main() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	c, err := fairlock.New(rdb,
		fairlock.WithPrefix("myapp:"),
		fairlock.WithLeaseTTL(10*time.Second),
		fairlock.WithWaiterTTL(3*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sem, err := semaphore.New(c, "encoders", 4)
	if err != nil {
		log.Fatal(err)
	}
	// Wait our turn (first-in first-out), run, release. The context passed
	// to the function ends if the lease is lost while it runs.
	err = sem.Do(ctx, 1, func(ctx context.Context) error {
		log.Println("encoding under a lease")
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
