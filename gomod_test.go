package fairlock_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every module of the repository declares the same go line, the root's:
// the oldest Go the modules build with (go 1.26.0, which go-redis, x/sys
// and OpenTelemetry declare; fairlock's own code uses nothing newer
// than Go 1.25's sync.WaitGroup.Go). A module declaring a later one would make its users
// upgrade for nothing; one declaring an earlier one cannot build. None
// names a toolchain: that is the builder's choice.
func TestModulesDeclareOneGoVersion(t *testing.T) {
	goLine := func(path string) (string, bool) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var version string
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "go":
				version = f[1]
			case len(f) >= 1 && f[0] == "toolchain":
				t.Errorf("%s names a toolchain: %s", path, strings.TrimSpace(line))
			}
		}
		return version, version != ""
	}
	want, ok := goLine("go.mod")
	if !ok {
		t.Fatal("go.mod has no go line")
	}
	var mods []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "go.mod" && path != "go.mod" {
			mods = append(mods, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) == 0 {
		t.Fatal("found no module but the root's")
	}
	for _, path := range mods {
		if got, ok := goLine(path); got != want || !ok {
			t.Errorf("%s declares go %q, want the root's go %s (one go line for every module)", path, got, want)
		}
	}
}
