package latch_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/latch"
)

// Three workers load their shards; the coordinator waits for all three,
// whichever process each runs in.
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

	loaded, err := latch.New(c, "shards-loaded", 3)
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	for shard := range 3 {
		wg.Go(func() {
			// ... load the shard ...
			_ = shard
			if err := loaded.CountDown(ctx); err != nil {
				log.Print(err)
			}
		})
	}
	if err := loaded.Wait(ctx); err != nil { // blocks until the count is 0
		log.Fatal(err)
	}
	wg.Wait()
	n, err := loaded.Count(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("shards loaded; count", n)
	// Output: shards loaded; count 0
}

// A tool reads a latch without knowing the count it was made with.
func ExampleInspect() {
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

	loaded, err := latch.New(c, "shards-loaded", 3)
	if err != nil {
		log.Fatal(err)
	}
	if err := loaded.CountDown(ctx); err != nil {
		log.Fatal(err)
	}
	st, err := latch.Inspect(ctx, c, "shards-loaded")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("count %d of %d, %d waiting\n", st.Count, st.Initial, st.Waiting)
	// Output: count 2 of 3, 0 waiting
}
