package robustness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/clients"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
)

// The environment a child process is started with.
const (
	envChild     = "ROBUSTNESS_CHILD" // the child's index; unset in the parent
	envAddr      = "ROBUSTNESS_ADDR"  // Redis, through the child's proxy
	envStore     = "ROBUSTNESS_STORE"
	envHist      = "ROBUSTNESS_HISTORY"
	envPrefix    = "ROBUSTNESS_PREFIX"
	envLease     = "ROBUSTNESS_LEASE"
	envWaiter    = "ROBUSTNESS_WAITER"
	envTimeout   = "ROBUSTNESS_TIMEOUT" // each fairlock call's context timeout
	envMutation  = "ROBUSTNESS_MUTATION"
	envAck       = "ROBUSTNESS_REPLICA_ACK" // replicas to wait for; 0 for none
	envSentinels = "ROBUSTNESS_SENTINELS"   // Sentinel addresses, comma-separated, in place of envAddr
	envCluster   = "ROBUSTNESS_CLUSTER"     // Cluster node addresses, likewise
	envLatch     = "ROBUSTNESS_LATCH"       // "1": a fifth worker runs the latch traffic (latch.go)
	envBarrier   = "ROBUSTNESS_BARRIER"     // "1": a sixth worker runs the barrier traffic (barrier.go)
)

// The traffic's semaphores and the store resources each one guards.
const (
	mutexName = "mx"
	semName   = "sem"
	semCap    = 3
	rwName    = "rw"
	multiTag  = "ml"
	multiA    = "{" + multiTag + "}:a"
	multiB    = "{" + multiTag + "}:b"
)

// A Target is the Redis a child is given (through the child's proxy, for
// one address).
type Target = clients.Target

// Dial returns a fairlock Client on a Target through the Redis client
// under test (see clients.Dial).
type Dial = clients.Dial

// IsChild reports whether this process was started as a child of a
// robustness run: its TestMain then runs [ChildMain] in place of the
// tests.
func IsChild() bool { return os.Getenv(envChild) != "" }

// GoRedis is the Dial of go-redis's clients.
var GoRedis = clients.GoRedis

// ChildMain runs a child through dial and returns its exit code: four
// workers (mutex, semaphore, read-write mutex, multi-lock), each a loop of
// acquire, read-modify-write on the fenced store, release, recorded in
// the history file, until stdin closes.
func ChildMain(dial Dial) int {
	idx, _ := strconv.Atoi(os.Getenv(envChild))
	dur := func(k string) time.Duration { d, _ := time.ParseDuration(os.Getenv(k)); return d }
	var mutation fairlock.Option
	if m := os.Getenv(envMutation); m != "" {
		mut, ok := Mutations[m]
		if !ok {
			fmt.Fprintln(os.Stderr, "unknown mutation", m)
			return 2
		}
		mutation = testhook.Transform[fairlock.Option](mut.Transform())
	}
	tg := Target{Addr: os.Getenv(envAddr)}
	if s := os.Getenv(envSentinels); s != "" {
		tg = Target{Sentinels: strings.Split(s, ","), MasterName: redisserver.MasterName}
	} else if s := os.Getenv(envCluster); s != "" {
		tg = Target{Cluster: strings.Split(s, ",")}
	}
	opts := []fairlock.Option{fairlock.WithPrefix(os.Getenv(envPrefix)),
		fairlock.WithLeaseTTL(dur(envLease)), fairlock.WithWaiterTTL(dur(envWaiter)),
		fairlock.WithOwner(fmt.Sprintf("child%d", idx)), mutation}
	if n, _ := strconv.Atoi(os.Getenv(envAck)); n > 0 {
		opts = append(opts, fairlock.WithReplicaAck(n, 500*time.Millisecond))
	}
	c, closeRedis, err := dial(tg, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer closeRedis()
	defer c.Close()
	f, err := os.OpenFile(os.Getenv(envHist), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer f.Close()
	stop, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	w := &worker{c: c, store: NewStoreClient(os.Getenv(envStore)), out: f, child: idx, timeout: dur(envTimeout)}
	// The child's own stalls (spans the host did not run it) excuse the
	// calls they made late, as a SIGSTOP's pause does (see Check).
	fltest.WatchStalls(stop, stallMin, func(from, till time.Time) {
		w.record(record{Stall: &Pause{Child: idx, From: from.UnixMicro(), Till: till.UnixMicro()}})
	})
	var wg sync.WaitGroup
	for i, run := range []func(*worker) (*fairlock.Lease, []string, []string, error){
		mutexTraffic, semTraffic, rwTraffic, multiTraffic} {
		wg.Go(func() {
			w := *w
			w.client = idx*16 + i
			w.rng = rand.New(rand.NewPCG(uint64(idx), uint64(i)))
			for stop.Err() == nil {
				w.round(run)
			}
		})
	}
	if os.Getenv(envLatch) == "1" {
		wg.Go(func() {
			w := *w
			w.client = idx*16 + 4
			w.rng = rand.New(rand.NewPCG(uint64(idx), 4))
			latchTraffic(stop, &w)
		})
	}
	if os.Getenv(envBarrier) == "1" {
		wg.Go(func() {
			w := *w
			w.client = idx*16 + 5
			w.rng = rand.New(rand.NewPCG(uint64(idx), 5))
			barrierTraffic(stop, &w)
		})
	}
	wg.Wait()
	return 0
}

// stallMin is the shortest stall of a child that its history records.
const stallMin = 100 * time.Millisecond

// worker is one traffic loop of a child.
type worker struct {
	c       *fairlock.Client
	store   *StoreClient
	out     *os.File
	child   int
	client  int
	timeout time.Duration
	rng     *rand.Rand
}

var writeMu sync.Mutex

func (w *worker) record(r record) {
	b, _ := json.Marshal(r)
	writeMu.Lock()
	defer writeMu.Unlock()
	_, _ = w.out.Write(append(b, '\n'))
}

func now() int64 { return time.Now().UnixMicro() }

// The traffic of each worker: it acquires, and returns the lease with the
// store resources to read-modify-write and those only to read.
func mutexTraffic(w *worker) (*fairlock.Lease, []string, []string, error) {
	m, err := semaphore.NewMutex(w.c, mutexName)
	if err != nil {
		return nil, nil, nil, err
	}
	l, err := w.acquire(m.Lock)
	return l, []string{mutexName}, nil, err
}

// semTraffic takes 1 to semCap permits: a holder of all of them is alone
// and writes, the others only read (their peers hold at the same time).
func semTraffic(w *worker) (*fairlock.Lease, []string, []string, error) {
	s, err := semaphore.New(w.c, semName, semCap)
	if err != nil {
		return nil, nil, nil, err
	}
	n := 1 + w.rng.Int64N(semCap)
	l, err := w.acquire(func(ctx context.Context) (*fairlock.Lease, error) { return s.Acquire(ctx, n) })
	if n == semCap {
		return l, []string{semName}, nil, err
	}
	return l, nil, []string{semName}, err
}

func rwTraffic(w *worker) (*fairlock.Lease, []string, []string, error) {
	rw, err := semaphore.NewRWMutex(w.c, rwName)
	if err != nil {
		return nil, nil, nil, err
	}
	if w.rng.IntN(2) == 0 {
		l, err := w.acquire(rw.Lock)
		return l, []string{rwName}, nil, err
	}
	l, err := w.acquire(rw.RLock)
	return l, nil, []string{rwName}, err
}

func multiTraffic(w *worker) (*fairlock.Lease, []string, []string, error) {
	l, err := w.acquire(func(ctx context.Context) (*fairlock.Lease, error) {
		return multilock.Lock(ctx, w.c, multiA, multiB)
	})
	return l, []string{multiA, multiB}, nil, err
}

// acquire calls f under the call timeout and records it.
func (w *worker) acquire(f func(context.Context) (*fairlock.Lease, error)) (*fairlock.Lease, error) {
	op := Op{Child: w.child, Client: w.client, Kind: "acquire", Call: now()}
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	op.Deadline = dl.UnixMicro()
	l, err := f(ctx)
	op.Return = now()
	if err != nil {
		op.Err, op.Class = err.Error(), classify(err)
	}
	w.record(record{Op: &op})
	return l, err
}

// round is one acquire, critical section, release.
func (w *worker) round(traffic func(*worker) (*fairlock.Lease, []string, []string, error)) {
	asked := now()
	l, writes, reads, err := traffic(w)
	if err != nil {
		time.Sleep(time.Duration(10+w.rng.IntN(20)) * time.Millisecond)
		return
	}
	rec := Lease{Child: w.child, Client: w.client, Asked: asked, Start: now()}
	for _, p := range l.Parts() {
		rec.Parts = append(rec.Parts, Part{Name: p.Name, Capacity: p.Capacity, Permits: p.Permits, Token: p.Token})
	}
	tok := func(name string) int64 {
		for _, p := range rec.Parts {
			if p.Name == name {
				return p.Token
			}
		}
		return l.Token()
	}
	// live notes the clock, checks the lease, and notes the clock again:
	// if it is still held, Redis held it at the first time (see Marks).
	live := func() bool {
		t := now()
		if l.Err() != nil {
			rec.Lost = true
			return false
		}
		rec.Marks = append(rec.Marks, [2]int64{t, now()})
		return true
	}
	ok := live()
	read := map[string]int64{}
	for _, r := range append(append([]string(nil), writes...), reads...) {
		if !ok {
			break
		}
		rep, err := w.storeOp(Op{Kind: "read", Res: r, Tok: tok(r)})
		ok = err == nil && !rep.Refused && live()
		read[r] = rep.Value
	}
	if ok {
		time.Sleep(time.Duration(2+w.rng.IntN(12)) * time.Millisecond)
		ok = live()
	}
	for _, r := range writes {
		if !ok {
			break
		}
		rep, err := w.storeOp(Op{Kind: "write", Res: r, Tok: tok(r), From: read[r], To: read[r] + 1})
		ok = err == nil && !rep.Refused && live()
	}
	live()
	op := Op{Child: w.child, Client: w.client, Kind: "release", Call: now()}
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	dl, _ := ctx.Deadline()
	op.Deadline = dl.UnixMicro()
	err = l.Release(ctx)
	cancel()
	op.Return = now()
	if err != nil {
		op.Err, op.Class = err.Error(), classify(err)
		if errors.Is(err, fairlock.ErrLeaseLost) {
			rec.Lost = true
		}
	}
	w.record(record{Op: &op})
	w.record(record{Lease: &rec})
	time.Sleep(time.Duration(w.rng.IntN(5)) * time.Millisecond)
}

// storeOp sends op to the store and records it. The store runs in the
// parent on loopback and is never faulted: its calls have no timeout.
func (w *worker) storeOp(op Op) (Reply, error) {
	op.Child, op.Client = w.child, w.client
	op.Call = now()
	var rep Reply
	var err error
	if op.Kind == "read" {
		rep, err = w.store.Read(context.Background(), op.Res, op.Tok)
	} else {
		rep, err = w.store.Write(context.Background(), op.Res, op.Tok, op.From, op.To)
	}
	op.Return = now()
	op.Reply = rep
	if err != nil {
		op.Err = err.Error()
	}
	w.record(record{Op: &op})
	return rep, err
}

// classify names the kind of a fairlock error, for the report.
func classify(err error) string {
	for _, k := range []struct {
		name string
		err  error
	}{
		{"deadline", context.DeadlineExceeded},
		{"stopped", context.Canceled}, // the child was told to stop (latch and barrier calls)
		{"lease-lost", fairlock.ErrLeaseLost},
		{"not-replicated", fairlock.ErrNotReplicated},
		{"incompatible", fairlock.ErrIncompatible},
		{"redis", fairlock.ErrRedis},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}
