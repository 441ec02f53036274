package faulttest

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// readLog tells each kind of a worker's log line: a Close's error is not
// an acquire error though its text holds " error ".
func TestReadLogTellsLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	lines := `1 7 enter 5 1 m
2 7 exit 5 1 m
3 7 error "fairlock: acquire \"m\": redis error: refused"
4 7 release "fairlock: release \"m\": lease lost"
5 7 closed "fairlock: close: redis error: 1 of 1 acquisitions the close ended could not be withdrawn (last: an error reply)"
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	o := readLog(t, path, 1)
	if o.enters != 1 || o.errors != 1 || o.releaseErrors != 1 || len(o.closeErrors) != 1 {
		t.Errorf("enters %d, errors %d, release errors %d, close errors %q; want 1 of each", o.enters, o.errors, o.releaseErrors, o.closeErrors)
	}
}

// A release that found its lease lost is put down to its process's stall
// only when that process stalled for a third of the lease TTL within the
// TTL before it.
func TestStalledReleases(t *testing.T) {
	const ttl = time.Second
	lost := `2000000 7 release "fairlock: release \"m\": lease lost"` + "\n"
	for _, tc := range []struct {
		name  string
		stall string
		want  int
	}{
		{"a long stall of its process just before", "1900000 7 stall 1500000 1900000\n", 1},
		{"a long stall that ended within the TTL before", "1900000 7 stall 600000 1100000\n", 1},
		{"a long stall that ended more than a TTL before", "1900000 7 stall 400000 900000\n", 0},
		{"a short stall of its process", "1900000 7 stall 1700000 1900000\n", 0},
		{"a long stall of another process", "1900000 8 stall 1500000 1900000\n", 0},
		{"a long stall long before", "1900000 7 stall 100000 500000\n", 0},
		{"a long stall after", "2600000 7 stall 2100000 2600000\n", 0},
	} {
		path := filepath.Join(t.TempDir(), "log")
		if err := os.WriteFile(path, []byte(tc.stall+lost), 0o644); err != nil {
			t.Fatal(err)
		}
		o := readLog(t, path, 1)
		if got := o.stalledReleases(ttl); got != tc.want || o.releaseErrors != 1 {
			t.Errorf("%s: %d stalled releases of %d release errors, want %d of 1", tc.name, got, o.releaseErrors, tc.want)
		}
	}
}
