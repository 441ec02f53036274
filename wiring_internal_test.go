package fairlock

import (
	"reflect"
	"testing"

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
		"waits.closeBlk": true,
	}
	c, err := New(redistest.Mini(t).Client(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
