package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// A process stopped past its lease's TTL (SIGSTOP, a long GC pause, a
// suspended VM) resumes with its timers not yet run: Err must already say
// the lease is lost, or the holder acts on a resource another holder now
// has. The scheduler is held up here as a stopped process's would be.
func TestErrSeesLeaseLapsedBeforeItsTimers(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, Request{Name: "lapse", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Err(); err != nil {
			t.Fatalf("Err() of a lease just granted = %v", err)
		}
		c.sched.Lock() // no renewal runs
		time.Sleep(ttl + ttl/2)
		err = l.Err()
		lapsed := errors.Is(err, ErrLeaseLost)
		c.sched.Unlock()
		if !lapsed {
			t.Fatalf("Err() %v past the lease's deadline, its renewal held up, = %v; want ErrLeaseLost", ttl/2, err)
		}
		select {
		case <-l.Done():
		default:
			t.Fatal("Done not closed once Err reported the lease lost")
		}
		if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release of the lapsed lease = %v", err)
		}
	})
}

// A renewal that comes after the lease's deadline because this process did
// not run in time (the scheduler held up, as a stopped process's is) ends
// the lease blaming the process, not Redis; nothing is sent.
func TestStalledRenewalBlamesTheProcess(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, Request{Name: "stall", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		c.sched.Lock() // no renewal runs: the process is stopped
		time.Sleep(ttl + ttl/2)
		c.sched.Unlock()
		<-l.Done()
		err = l.Err()
		if !errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "this process") {
			t.Fatalf("Err() of a lease whose process stalled past its deadline = %v; want ErrLeaseLost blaming the process, not ErrRedis", err)
		}
	})
}

// renewalFailure blames the process for a renewal that went out more
// than a renewal period after it was due, and Redis for one it did not
// answer in time, or failed: a renewal due at once after a slow answer,
// with little time left, is Redis's slowness.
func TestRenewalFailureSaysWhose(t *testing.T) {
	const ttl = time.Second
	deadline := time.Now()
	for _, tc := range []struct {
		err      error
		left     time.Duration // the deadline less the sending
		late     time.Duration // the sending less when it was due
		redis    bool
		contains string
	}{
		{context.DeadlineExceeded, 5 * time.Millisecond, 600 * time.Millisecond, false, "this process ran late"},
		{context.DeadlineExceeded, 5 * time.Millisecond, 0, true, "Redis did not answer"},
		{context.DeadlineExceeded, 600 * time.Millisecond, 0, true, "Redis did not answer"},
		{errors.New("LOADING Redis is loading"), 600 * time.Millisecond, 0, true, "LOADING"},
	} {
		sent := deadline.Add(-tc.left)
		got := renewalFailure(tc.err, sent, sent.Add(-tc.late), deadline, ttl)
		if errors.Is(got, ErrRedis) != tc.redis || !strings.Contains(got.Error(), tc.contains) {
			t.Errorf("renewalFailure(%v, sent %v before the deadline, %v after it was due) = %v; want ErrRedis %v, saying %q", tc.err, tc.left, tc.late, got, tc.redis, tc.contains)
		}
	}
}

// holdingObserver holds up the first report of a lost lease until release
// closes: the lease is then part-way through ending, its cause decided and
// its context not yet cancelled.
type holdingObserver struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (o *holdingObserver) Observe(e Event) {
	if e.Kind != LeaseLost {
		return
	}
	o.once.Do(func() {
		close(o.entered)
		<-o.release
	})
}

// Err reads nil only while the lease is live in Redis. Every way a lease
// ends on its own decides so in one goroutine, then reports and cancels in
// a while; an Err (which ownership checks read too), a LeaseContext made
// before, or one made meanwhile, in another goroutine, must already say it
// ended. (A holder resumed from a
// stop past its lease runs its renewal timer and its own Err at once: an
// Err that read nil there let it act beside the next holder.) Each row
// ends a lease one way and holds the ending up at its report.
func TestErrSeesALeaseThatIsEnding(t *testing.T) {
	past := func(l *Lease) {
		l.rmu.Lock()
		l.deadline = time.Now().Add(-time.Millisecond)
		l.rmu.Unlock()
	}
	for _, tc := range []struct {
		name    string
		maxHold time.Duration
		want    error // ErrLeaseLost if nil
		end     func(t *testing.T, b *redistest.Backend, l *Lease)
	}{
		{name: "its renewal runs past its deadline", end: func(t *testing.T, b *redistest.Backend, l *Lease) {
			past(l)
			l.renew()
		}},
		{name: "its renewals failed until its deadline", end: func(t *testing.T, b *redistest.Backend, l *Lease) {
			l.rmu.Lock()
			l.renewErr = fmt.Errorf("%w: refused", ErrRedis)
			l.rmu.Unlock()
			past(l)
			l.renew()
		}},
		{name: "Redis answers its renewal: expired", end: func(t *testing.T, b *redistest.Backend, l *Lease) {
			if err := b.Client(t).Del(context.Background(), l.p.keys...).Err(); err != nil {
				t.Error(err)
				return
			}
			l.renew()
		}},
		{name: "another Err finds it past its deadline", end: func(t *testing.T, b *redistest.Backend, l *Lease) {
			past(l)
			_ = l.Err()
		}},
		{name: "a LeaseContext finds it past its deadline", end: func(t *testing.T, b *redistest.Backend, l *Lease) {
			past(l)
			_, cancel := LeaseContext(context.Background(), l)
			cancel()
		}},
		{name: "it reaches its cap on holding", maxHold: time.Minute, want: ErrMaxHold, end: func(t *testing.T, b *redistest.Backend, l *Lease) {
			l.rmu.Lock()
			l.holdEnd = time.Now().Add(-time.Millisecond)
			l.deadline = l.holdEnd
			l.rmu.Unlock()
			l.renew()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				obs := &holdingObserver{entered: make(chan struct{}), release: make(chan struct{})}
				var released sync.Once
				letGo := func() { released.Do(func() { close(obs.release) }) }
				defer letGo()
				opts := []Option{WithPrefix(redistest.Prefix(t)), WithLeaseTTL(time.Minute), WithObserver(obs)}
				if tc.maxHold > 0 {
					opts = append(opts, WithMaxHold(tc.maxHold))
				}
				c, err := New(b.Client(t), opts...)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				l, err := c.Acquire(context.Background(), Request{Name: "ending", Capacity: 1, Permits: 1})
				if err != nil {
					t.Fatal(err)
				}
				before, cancelBefore := LeaseContext(context.Background(), l)
				defer cancelBefore()
				ended := make(chan struct{})
				go func() {
					defer close(ended)
					tc.end(t, b, l)
				}()
				select {
				case <-obs.entered:
				case <-ended:
					t.Fatal("the lease did not end")
				case <-time.After(10 * time.Second):
					t.Fatal("the lease did not end within 10s")
				}
				err = l.Err()
				ctx, cancel := LeaseContext(context.Background(), l)
				beforeErr, madeErr := before.Err(), ctx.Err()
				letGo()
				<-ended
				defer cancel()
				want := tc.want
				if want == nil {
					want = ErrLeaseLost
				}
				if !errors.Is(err, want) {
					t.Errorf("Err() while the lease ends = %v; want %v", err, want)
				}
				if beforeErr == nil {
					t.Error("a LeaseContext made before the lease ended is not cancelled while it ends")
				}
				if madeErr == nil {
					t.Error("a LeaseContext made while the lease ends is returned live")
				}
				<-l.Done()
			})
		})
	}
}
