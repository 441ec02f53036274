// Command shutdown is the guide's graceful close: a worker that, told to
// stop, closes its fairlock client so that the lease it still holds goes
// to the next waiter at once rather than when its TTL runs out.
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
	if lease, err := m.Lock(ctx); err == nil {
		log.Printf("working under token %d until told to stop", lease.Token())
		<-ctx.Done() // the work would watch ctx and lease.Done()
	}

	// Release what the client still holds, within five seconds.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Shutdown(sctx); err != nil { // or c.Close(), bounded by one waiter TTL
		log.Printf("closing fairlock: %v", err)
	}
}
