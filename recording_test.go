package fairlock

import (
	"context"
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/halfrun"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/testhook"
)

// TestRecordingLeavesReadsAlone runs every op whose script declares
// no-writes, and a write beside them, through a client whose scripts
// record their calls (differential.Recording, over internal/halfrun's
// check as the differential test's clients have it): the reads must
// answer as they do unrecorded (a real Redis refuses any write from a
// no-writes script: "Write commands are not allowed from read-only
// scripts") and none may be recorded, on any server; the write must be.
func TestRecordingLeavesReadsAlone(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t)
		logKey := "fltest:log:" + rand.Text()
		c, err := New(rdb, WithPrefix(redistest.Prefix(t)), withTransform(recording(logKey, halfrun.Transform)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		reads := map[string]func() error{
			"status": func() error {
				_, err := c.Status(ctx, "s")
				return err
			},
			"leader_get": func() error {
				_, err := c.leaderGet(ctx, "e")
				return err
			},
			"latch_count": func() error {
				_, _, err := c.latchCount(ctx, "l", 2)
				return err
			},
			"barrier_status": func() error {
				_, _, _, _, err := c.barrierStatus(ctx, "b", 2)
				return err
			},
		}
		// Every op whose script declares no-writes is read here: a new
		// one must join the table.
		for _, o := range script.AllOps {
			if slices.Contains(strings.Split(script.Entries[o.EntryIndex].Flags, ","), "no-writes") && reads[o.Name] == nil {
				t.Errorf("op %s declares no-writes and is not read by this test", o.Name)
			}
		}
		for name, read := range reads {
			if err := read(); err != nil {
				t.Errorf("%s through a recording client: %v", name, err)
			}
		}
		if _, _, err := c.latchDown(ctx, "l", 2, time.Minute); err != nil {
			t.Fatalf("latch_down through a recording client: %v", err)
		}
		// The reads again, once the latch and its resource exist.
		for name, read := range reads {
			if err := read(); err != nil {
				t.Errorf("%s through a recording client, after a write: %v", name, err)
			}
		}
		// (ReadLog refuses a recorded read itself; the raw log shows
		// which it was.)
		raw, err := rdb.LRange(ctx, logKey, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		calls, err := differential.ReadLog(ctx, rdb, logKey)
		if err != nil {
			t.Fatalf("%v\nthe log: %q", err, raw)
		}
		var ops []string
		for _, call := range calls {
			ops = append(ops, call.Op())
		}
		if !slices.Equal(ops, []string{"latch_down"}) {
			t.Fatalf("recorded ops %v, want [latch_down]", ops)
		}
	})
}

// TestTransformsSeeFlags checks that a transform is given each script
// with the "#!lua" line of its entry's flags first, as Redis reads it,
// and that the transforms that add code before a script (the recording,
// the replay's clock, the half-run check) keep the line first: newCode
// panics otherwise.
func TestTransformsSeeFlags(t *testing.T) {
	var got, want []string
	script.NewCode(func(src string) string {
		got = append(got, strings.Join(testhook.Flags(src), ","))
		return src
	})
	for _, e := range script.Entries {
		want = append(want, e.Flags)
		if e.Batch {
			want = append(want, e.Flags)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the flags transforms are given: %q, want %q", got, want)
	}
	k := script.NewCode(compose(recording("fltest:log", halfrun.Transform), replayed(nil)))
	for _, e := range script.Entries {
		if e.Flags != "" && k.Flagged[e.Name] == nil {
			t.Errorf("entry %s declares %s, and has no flagged form", e.Name, e.Flags)
		}
	}
}
