package fairlock

import (
	"errors"
	"testing"

	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// Every reply acquire.lua documents reads as its code says, and a reply
// that does not read as one of them is an error matching ErrRedis, never a
// grant with missing tokens or a queued wait with no clock.
func TestParseAcquireReply(t *testing.T) {
	cmd := func(v ...any) script.Result { return script.Result{Val: v} }
	failed := script.Result{Err: errors.New("connection reset")}
	for _, tc := range []struct {
		name  string
		cmd   script.Result
		parts int
		want  acquireReply // when ok
		ok    bool
	}{
		{"granted", cmd(int64(1), int64(100), int64(10100), "7"), 1, acquireReply{code: acqGranted, now: 100, g: wait.Grant{Expiry: 10100, Tokens: []int64{7}}}, true},
		{"granted before, two semaphores", cmd(int64(3), "100", "3100", "7", "9"), 2, acquireReply{code: acqGrantedBefore, now: 100, g: wait.Grant{Expiry: 3100, Tokens: []int64{7, 9}}}, true},
		{"queued", cmd(int64(2), int64(100), int64(250)), 1, acquireReply{code: acqQueued, now: 100, next: 250}, true},
		{"not granted", cmd(int64(0)), 1, acquireReply{code: acqNotGranted}, true},
		{"ended", cmd(int64(4)), 1, acquireReply{code: acqEnded}, true},
		{"a grant short of a token", cmd(int64(1), int64(100), int64(10100), "7"), 2, acquireReply{}, false},
		{"a grant with a token too many", cmd(int64(1), int64(100), int64(10100), "7", "8"), 1, acquireReply{}, false},
		{"a token that is not a number", cmd(int64(1), int64(100), int64(10100), "x"), 1, acquireReply{}, false},
		{"a token 0", cmd(int64(1), int64(100), int64(10100), "0"), 1, acquireReply{}, false},
		{"queued without its next event", cmd(int64(2), int64(100)), 1, acquireReply{}, false},
		{"an unknown code", cmd(int64(7), int64(100)), 1, acquireReply{}, false},
		{"no code", cmd(), 1, acquireReply{}, false},
		{"a code that is not a number", cmd("granted"), 1, acquireReply{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAcquireReply(tc.cmd, tc.parts)
			if !tc.ok {
				if !errors.Is(err, ErrRedis) {
					t.Fatalf("parseAcquireReply = %+v, %v; want an error matching ErrRedis", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseAcquireReply: %v", err)
			}
			if got.code != tc.want.code || got.now != tc.want.now || got.next != tc.want.next || got.g.Expiry != tc.want.g.Expiry || len(got.g.Tokens) != len(tc.want.g.Tokens) {
				t.Fatalf("parseAcquireReply = %+v; want %+v", got, tc.want)
			}
			for i := range got.g.Tokens {
				if got.g.Tokens[i] != tc.want.g.Tokens[i] {
					t.Fatalf("parseAcquireReply = %+v; want %+v", got, tc.want)
				}
			}
		})
	}
	// The command's own error passes through as it is: the caller tells a
	// refused script from a lost connection by it.
	if _, err := parseAcquireReply(failed, 1); err == nil || errors.Is(err, ErrRedis) || err.Error() != "connection reset" {
		t.Errorf("parseAcquireReply of a failed command = %v; want its error as it is", err)
	}
}
