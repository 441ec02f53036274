package faulttest

import (
	"os"
	"path/filepath"
	"testing"
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
