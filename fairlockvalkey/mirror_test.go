package fairlockvalkey_test

import (
	"os"
	"strings"
	"testing"
)

// valkey-go is a fork of rueidis with its names changed, so this Backend
// is fairlockrueidis's with the same names changed, and stays so: a fix
// made in one is made in both.
func TestMirrorsRueidis(t *testing.T) {
	src, err := os.ReadFile("../fairlockrueidis/rueidis.go")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("valkey.go")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.NewReplacer(
		"package fairlockrueidis", "package fairlockvalkey",
		"// Package fairlockrueidis runs fairlock on a rueidis client", "// Package fairlockvalkey runs fairlock on a valkey-go client",
		"fairlockrueidis.New", "fairlockvalkey.New",
		`"github.com/redis/rueidis"`, `"github.com/valkey-io/valkey-go"`,
		"rueidis.IsRedisNil", "valkey.IsValkeyNil",
		"rueidis.IsRedisErr", "valkey.IsValkeyErr",
		"rueidis.RedisResult", "valkey.ValkeyResult",
		"rueidis.RedisMessage", "valkey.ValkeyMessage",
		"rueidis.RedisError", "valkey.ValkeyError",
		"rueidis.", "valkey.",
		"rueidis", "valkey-go",
	).Replace(string(src))
	if string(got) != want {
		a, b := strings.Split(want, "\n"), strings.Split(string(got), "\n")
		for i := 0; i < len(a) && i < len(b); i++ {
			if a[i] != b[i] {
				t.Fatalf("valkey.go line %d is %q; fairlockrueidis/rueidis.go with valkey-go's names has %q", i+1, b[i], a[i])
			}
		}
		t.Fatalf("valkey.go has %d lines; fairlockrueidis/rueidis.go with valkey-go's names has %d", len(b), len(a))
	}
}
