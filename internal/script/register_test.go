package script

import (
	"strings"
	"testing"
)

// TestRegisterRefusesANameInUse holds Register to its word: a name that an
// entry or an op already has panics, whether the op is served by an entry
// of its own name (acquire) or by another's (try, served by acquire's).
func TestRegisterRefusesANameInUse(t *testing.T) {
	for _, name := range []string{"acquire", "wait", "try", "renew", "leave", "leader_set", "leader_clear"} {
		t.Run(name, func(t *testing.T) {
			nEntries, nOps := len(Entries), len(AllOps)
			defer func() {
				r := recover()
				if r == nil {
					t.Fatalf("Register(%q) did not panic", name)
				}
				if msg, _ := r.(string); !strings.Contains(msg, "registered twice") {
					t.Fatalf("Register(%q) panicked with %v, want a name registered twice", name, r)
				}
				if len(Entries) != nEntries || len(AllOps) != nOps {
					t.Fatalf("Register(%q) panicked after adding to the lists", name)
				}
			}()
			Register(name, "lua/ops/x.lua", "", false)
		})
	}
}
