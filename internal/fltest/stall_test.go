package fltest

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// WatchStalls sees a span in which the process did not run: a shell
// stops this process (SIGSTOP) for 300 ms, then resumes it.
func TestWatchStallsSeesAStop(t *testing.T) {
	if testing.Short() {
		t.Skip("stops the test process")
	}
	var mu sync.Mutex
	var longest time.Duration
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	WatchStalls(ctx, 100*time.Millisecond, func(from, till time.Time) {
		mu.Lock()
		longest = max(longest, till.Sub(from))
		mu.Unlock()
	})
	time.Sleep(20 * time.Millisecond)
	pid := strconv.Itoa(os.Getpid())
	if out, err := exec.Command("sh", "-c", "kill -STOP "+pid+"; sleep 0.3; kill -CONT "+pid).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if longest < 250*time.Millisecond {
		t.Errorf("longest stall seen %v, want about 300ms", longest)
	}
}
