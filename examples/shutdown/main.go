// Command shutdown is the guide's graceful close: a worker that, told to
// stop, lets the work under its lease finish and release the lease, then
// closes its fairlock client, so that the lease goes to the next waiter as
// soon as the work is over rather than when its TTL runs out.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	m, err := semaphore.NewMutex(c, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	work := make(chan error, 1)
	go func() {
		work <- m.Do(ctx, func(ctx context.Context) error {
			log.Print("working until told to stop")
			<-ctx.Done() // the work watches ctx: told to stop, or the lease lost
			return nil   // Do then releases the lease
		})
	}()
	<-ctx.Done()

	// Refuse new work, let the work under the lease finish and release
	// it, and end whatever is still held after five seconds.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Shutdown(sctx); err != nil { // c.Close() would release at once
		log.Printf("closing fairlock: %v", err)
	}
	log.Printf("work: %v", <-work)
}
