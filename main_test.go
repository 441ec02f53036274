package fairlock

import (
	"flag"
	"os"
	"testing"

	"github.com/fairlock/fairlock/internal/halfrun"
	"github.com/fairlock/fairlock/internal/redistest"
)

// TestMain sets what every test of the package runs under: a few hundred
// state machines per property test (a few dozen with -short, the quick
// tier), and every script of every client failing with FAIRLOCK_HALF_RUN
// if it errors after its first write (tests that swap a script replace
// this transform while they run). Under -race, the long tier's test
// binary without the detector (redistest.RunWithoutRace) is built in the
// background from the start. redistest.Main starts the real server.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
	if !given && os.Getenv("RAPID_CHECKS") == "" {
		checks := "300"
		if testing.Short() {
			checks = "30"
		}
		_ = flag.Set("rapid.checks", checks)
	}
	setTestTransform(halfrun.Transform)
	redistest.BuildWithoutRaceEarly()
	redistest.Main(m)
}
