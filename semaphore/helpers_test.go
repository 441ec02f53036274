package semaphore_test

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// newSem returns the semaphore name of client c, failing the test on an
// error.
func newSem(t *testing.T, c *fairlock.Client, name string, capacity int64) *semaphore.Semaphore {
	t.Helper()
	s, err := semaphore.New(c, name, capacity)
	if err != nil {
		t.Fatalf("semaphore.New(%q, %d): %v", name, capacity, err)
	}
	return s
}

// acquireAsync starts s.Acquire in a goroutine and returns where its
// result will arrive.
func acquireAsync(ctx context.Context, s *semaphore.Semaphore, n int64) <-chan fltest.Result {
	return fltest.Async(func() (*fairlock.Lease, error) { return s.Acquire(ctx, n) })
}
