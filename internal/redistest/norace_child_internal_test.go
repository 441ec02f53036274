package redistest

import (
	"regexp"
	"strings"
	"testing"
)

// The child's -test.run picks the test or subtest RunWithoutRace was
// given, and below it what the parent's pattern picked.
func TestChildRun(t *testing.T) {
	for _, tc := range []struct{ name, run, want string }{
		{"TestX", "", "^TestX$"},
		{"TestX", "TestX", "^TestX$"},
		{"TestX", "TestX/sub", "^TestX$/sub"},
		{"TestX/miniredis", "", "^TestX$/^miniredis$"},
		{"TestX/miniredis", "TestX/miniredis", "^TestX$/^miniredis$"},
		{"TestX/miniredis", "TestX/mini/fast=true", "^TestX$/^miniredis$/fast=true"},
		{"TestX/a_(b)", "", `^TestX$/^a_\(b\)$`},
	} {
		got := childRun(tc.name, tc.run)
		if got != tc.want {
			t.Errorf("childRun(%q, %q) = %q, want %q", tc.name, tc.run, got, tc.want)
		}
		// Each element matches the name's element, as go test matches.
		for i, elem := range strings.Split(tc.name, "/") {
			if !regexp.MustCompile(strings.Split(got, "/")[i]).MatchString(elem) {
				t.Errorf("%q's element %d does not match %q", got, i, elem)
			}
		}
	}
}
