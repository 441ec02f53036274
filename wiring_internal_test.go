package fairlock

import (
	"reflect"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// Every part a Client is built of (its call path, its renewal batches, its
// waits) gets all of its wiring when the Client is made: a channel,
// function, pointer, interface or map left nil there fails later, out of
// sight (a nil Done channel never fires, so a listener waiting out its
// backoff would not hear Close). The fields that are nil until first use
// are named here.
func TestClientPartsWired(t *testing.T) {
	lazy := map[string]bool{
		"waits.blk":      true, // made on the first wait (blockingLocked)
		"waits.CloseBlk": true,
		"calls.Batch":    true, // WithBatching's: checked below
		"waits.Spare":    true, // the first room made and forgotten without running
	}
	c, err := New(redistest.Mini(t).Client(t), WithLeaseTTL(7*time.Second), WithWaiterTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The settings the parts copy are the client's.
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"calls.ackReplicas", c.calls.AckReplicas, c.cfg.ackReplicas},
		{"calls.ackTimeout", c.calls.AckTimeout, c.cfg.ackTimeout},
		{"renew.LeaseTTL", c.renew.LeaseTTL, c.cfg.leaseTTL},
		{"renew.ID", c.renew.ID, c.id},
		{"waits.id", c.waits.ID, c.id},
		{"waits.leaseMs", c.waits.LeaseMs, c.leaseMs},
		{"waits.waiterMs", c.waits.WaiterMs, c.waiterMs},
		{"waits.done", c.waits.Done, c.done},
		{"waits.closing", c.waits.Closing, c.closing},
		{"waits.WaiterTTL", c.waits.WaiterTTL, c.cfg.waiterTTL},
		{"waits.Prefix", c.waits.Prefix, c.cfg.prefix},
		{"renew.Closing", c.renew.Closing, c.renewing},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want the client's %v", tc.name, tc.got, tc.want)
		}
	}
	batching, err := New(redistest.Mini(t).Client(t), WithBatching(4))
	if err != nil {
		t.Fatal(err)
	}
	defer batching.Close()
	if b := batching.calls.Batch; b == nil || b.Caller() != batching.calls || b.Max() != 4 {
		t.Errorf("WithBatching(4): calls.batch is %+v, want a batcher of the client's call path, 4 calls a batch", b)
	}
	for name, part := range map[string]any{"calls": c.calls, "renew": c.renew, "waits": c.waits} {
		v := reflect.ValueOf(part).Elem()
		for i := range v.NumField() {
			f, field := v.Field(i), name+"."+v.Type().Field(i).Name
			switch f.Kind() {
			case reflect.Chan, reflect.Func, reflect.Pointer, reflect.Interface, reflect.Map:
				if f.IsNil() && !lazy[field] {
					t.Errorf("%s is nil in a new Client", field)
				}
			}
		}
	}
}
