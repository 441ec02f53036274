package ops

import (
	"errors"
	"testing"

	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// Every reply acquire.lua documents reads as its code says, and a reply
// that does not read as one of them is an error matching fault.ErrRedis, never a
// grant with missing tokens or a queued wait with no clock.
func TestParseAcquireReply(t *testing.T) {
	cmd := func(v ...any) script.Result { return script.Result{Val: v} }
	failed := script.Result{Err: errors.New("connection reset")}
	for _, tc := range []struct {
		name  string
		cmd   script.Result
		parts int
		want  AcquireReply // when ok
		ok    bool
	}{
		{"granted", cmd(int64(1), int64(100), int64(10100), "7"), 1, AcquireReply{Code: AcqGranted, Now: 100, Grant: wait.Grant{Expiry: 10100, Tokens: []int64{7}}}, true},
		{"granted before, two semaphores", cmd(int64(3), "100", "3100", "7", "9"), 2, AcquireReply{Code: AcqGrantedBefore, Now: 100, Grant: wait.Grant{Expiry: 3100, Tokens: []int64{7, 9}}}, true},
		{"queued", cmd(int64(2), int64(100), int64(250)), 1, AcquireReply{Code: AcqQueued, Now: 100, Next: 250}, true},
		{"not granted", cmd(int64(0)), 1, AcquireReply{Code: AcqNotGranted}, true},
		{"ended", cmd(int64(4)), 1, AcquireReply{Code: AcqEnded}, true},
		{"a grant short of a token", cmd(int64(1), int64(100), int64(10100), "7"), 2, AcquireReply{}, false},
		{"a grant with a token too many", cmd(int64(1), int64(100), int64(10100), "7", "8"), 1, AcquireReply{}, false},
		{"a token that is not a number", cmd(int64(1), int64(100), int64(10100), "x"), 1, AcquireReply{}, false},
		{"a token 0", cmd(int64(1), int64(100), int64(10100), "0"), 1, AcquireReply{}, false},
		{"queued without its next event", cmd(int64(2), int64(100)), 1, AcquireReply{}, false},
		{"an unknown code", cmd(int64(7), int64(100)), 1, AcquireReply{}, false},
		{"no code", cmd(), 1, AcquireReply{}, false},
		{"a code that is not a number", cmd("granted"), 1, AcquireReply{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAcquireReply(tc.cmd, tc.parts)
			if !tc.ok {
				if !errors.Is(err, fault.ErrRedis) {
					t.Fatalf("ParseAcquireReply = %+v, %v; want an error matching fault.ErrRedis", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAcquireReply: %v", err)
			}
			if got.Code != tc.want.Code || got.Now != tc.want.Now || got.Next != tc.want.Next || got.Grant.Expiry != tc.want.Grant.Expiry || len(got.Grant.Tokens) != len(tc.want.Grant.Tokens) {
				t.Fatalf("ParseAcquireReply = %+v; want %+v", got, tc.want)
			}
			for i := range got.Grant.Tokens {
				if got.Grant.Tokens[i] != tc.want.Grant.Tokens[i] {
					t.Fatalf("ParseAcquireReply = %+v; want %+v", got, tc.want)
				}
			}
		})
	}
	// The command's own error passes through as it is: the caller tells a
	// refused script from a lost connection by it.
	if _, err := ParseAcquireReply(failed, 1); err == nil || errors.Is(err, fault.ErrRedis) || err.Error() != "connection reset" {
		t.Errorf("ParseAcquireReply of a failed command = %v; want its error as it is", err)
	}
}
