// Command quickstart is the guide's valkey-go example: a fair mutex through
// a valkey-go client.
package main

import (
	"context"
	"log"

	"github.com/fairlock/fairlock/fairlockvalkey"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/valkey-io/valkey-go"
)

func main() {
	ctx := context.Background()
	rdb, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()

	c, err := fairlockvalkey.New(rdb)
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
