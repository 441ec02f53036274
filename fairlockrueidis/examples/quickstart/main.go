// Command quickstart is the guide's rueidis example: a fair mutex through
// a rueidis client.
package main

import (
	"context"
	"log"

	"github.com/fairlock/fairlock/fairlockrueidis"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/rueidis"
)

func main() {
	ctx := context.Background()
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()

	c, err := fairlockrueidis.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	mu, err := semaphore.NewMutex(c, "ledger")
	if err != nil {
		log.Fatal(err)
	}
	err = mu.Do(ctx, func(ctx context.Context) error {
		log.Println("writing the ledger under a lease")
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
