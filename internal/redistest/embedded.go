package redistest

import (
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Embedded starts an embedded Redis (miniredis) for a runnable example and
// returns a client of it and a function that stops both; a program would
// connect to its own Redis instead. It exits the program if the server
// cannot start, as examples have no *testing.T to fail.
func Embedded() (rdb *redis.Client, stop func()) {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { _ = rdb.Close(); mr.Close() }
}
