package robustness

import "strings"

// A Mutation breaks one rule of fairlock's Lua on purpose, to show that
// the suite sees the break: in File (relative to the module root), Old is
// replaced by New.
type Mutation struct {
	File, Old, New string
}

// Mutations are the rules the suite must catch broken, by name. Every
// replacement target lives here, so that when the Lua changes, this is the
// one place to update (TestMutationTargetsExist fails until it is).
var Mutations = map[string]Mutation{
	// fits_in always says yes: the capacity check is gone, so a mutex or a
	// semaphore grants past its capacity.
	"capacity": {"lua/rules.lua",
		"  return cap ~= nil and used + n <= cap\n",
		"  return cap ~= nil\n"},
	// next_token stops rising within a second of Redis's clock: every grant
	// in that second gets the token of the first.
	"token-reuse": {"lua/rules.lua",
		"    return math.max(exact(seq) + 1, now_us)\n",
		"    return math.max(exact(seq), now_us - now_us % 1000000)\n"},
	// A countdown latch opens on any count down that finds waiters, its
	// count not yet 0: their Waits return early.
	"latch-early": {"lua/ops/latch.lua",
		"if count == 0 and r.nc > 0 then\n  -- Open:",
		"if r.nc > 0 then\n  -- Open:"},
	// A cyclic barrier's round completes one party early: its
	// next-to-last arrival ends it.
	"barrier-early": {"lua/ops/barrier.lua",
		"if n + 1 >= parties then\n",
		"if n + 2 >= parties then\n"},
}

// Transform returns the script transform (for internal/testhook.Transform)
// that applies m to a script's source; a source without m.Old passes
// unchanged (TestMutationTargetsExist keeps every target in place).
func (m Mutation) Transform() func(string) string {
	return func(src string) string { return strings.ReplaceAll(src, m.Old, m.New) }
}
