package robustness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// An Op is one entry of a history: a call to the store (Kind "read" or
// "write") or to fairlock (Kind "acquire" or "release", the latch's and the barrier's calls), with its
// invocation and return times in Unix microseconds by the host's clock.
type Op struct {
	Child  int    `json:"child"`
	Client int    `json:"client"` // unique over the run: child*16 + worker
	Kind   string `json:"kind"`
	Res    string `json:"res,omitempty"` // store resource (read, write)
	Tok    int64  `json:"tok,omitempty"`
	From   int64  `json:"from,omitempty"`
	To     int64  `json:"to,omitempty"`
	Reply
	Err      string `json:"err,omitempty"`
	Class    string `json:"class,omitempty"` // the error's kind (see classify)
	Call     int64  `json:"call"`
	Return   int64  `json:"return"`
	Deadline int64  `json:"deadline,omitempty"` // the call's context deadline (acquire, release, latch calls)
	N        int64  `json:"n,omitempty"`        // the count a latch call answered (latch_down, latch_count); the round a barrier Await reported
	Index    int    `json:"index,omitempty"`    // the index in its round a barrier Await reported
}

// A Lease is one grant as a child saw it: its parts and the span in which
// the child knows it was live, by the host's clock (Unix microseconds).
type Lease struct {
	Child  int    `json:"child"`
	Client int    `json:"client"`
	Parts  []Part `json:"parts"`
	// Asked is when Acquire was called, Start when it returned: the grant
	// lies between them.
	Asked, Start int64
	// Marks are the child's checks that the lease was live: it read the
	// clock (the first time), found Lease.Err nil, and read the clock
	// again. A lease's Done closes before Redis can give its permits to
	// another, so Redis held the lease at a mark's first time, unless the
	// process was stopped between the two readings (its timers could not
	// close Done): Check drops the marks that straddle a pause.
	Marks [][2]int64 `json:"marks"`
	// Lost says the child saw the lease end before it released it (Err
	// not nil, or Release reporting ErrLeaseLost).
	Lost bool `json:"lost,omitempty"`
}

// A Part is what a lease holds of one semaphore.
type Part struct {
	Name     string `json:"name"`
	Capacity int64  `json:"cap"`
	Permits  int64  `json:"permits"`
	Token    int64  `json:"tok"`
}

// record is one line of a child's history file: an Op, a Lease, or a
// Stall.
type record struct {
	Op    *Op    `json:"op,omitempty"`
	Lease *Lease `json:"lease,omitempty"`
	Stall *Pause `json:"stall,omitempty"`
}

// A History is what every child of a run recorded.
type History struct {
	Ops    []Op
	Leases []Lease
	// Stalls are the spans in which a child did not run though nobody
	// stopped it (the host did not schedule it), as the child measured
	// them: longer than stallMin.
	Stalls []Pause
}

// ReadHistories reads every history file in dir (child-*.jsonl).
func ReadHistories(dir string) (History, error) {
	var h History
	files, err := filepath.Glob(filepath.Join(dir, "child-*.jsonl"))
	if err != nil {
		return h, err
	}
	for _, f := range files {
		if err := readHistory(f, &h); err != nil {
			return h, err
		}
	}
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Call < h.Ops[j].Call })
	sort.SliceStable(h.Leases, func(i, j int) bool { return h.Leases[i].Start < h.Leases[j].Start })
	return h, nil
}

func readHistory(path string, h *History) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			// A child killed mid-write leaves a torn last line.
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if r.Op != nil {
			h.Ops = append(h.Ops, *r.Op)
		}
		if r.Lease != nil {
			h.Leases = append(h.Leases, *r.Lease)
		}
		if r.Stall != nil {
			h.Stalls = append(h.Stalls, *r.Stall)
		}
	}
	return sc.Err()
}
