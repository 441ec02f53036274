package redistest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fairlock/fairlock/internal/redisserver"
)

func TestMain(m *testing.M) { Main(m) }

// The shared server is the program FAIRLOCK_REDIS_SERVER_DIR (or PATH)
// names, and Main names it correctly: its INFO reports the version that
// program's --version prints.
func TestServerIsTheOneChosen(t *testing.T) {
	RealBackend(t)
	got, ok := Server()
	if !ok {
		t.Fatal("a real backend but no server named")
	}
	want, err := redisserver.Which()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("the shared server is %s; the chosen program is %s", got, want)
	}
	if dir := os.Getenv(redisserver.EnvDir); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(got.Path) != abs {
			t.Errorf("%s=%s but the server ran from %s", redisserver.EnvDir, dir, got.Path)
		}
	}
	t.Logf("shared server: %s", got)
}

// FAIRLOCK_REAL_ONLY=1 skips Each's miniredis subtest and tests that call
// Mini; unset, both halves run.
func TestRealOnly(t *testing.T) {
	RealBackend(t)
	for _, tc := range []struct {
		env  string
		want map[string]bool
	}{
		{"1", map[string]bool{"redis": true}},
		{"", map[string]bool{"redis": true, "miniredis": true}},
	} {
		t.Setenv(EnvRealOnly, tc.env)
		ran := map[string]bool{}
		Each(t, func(t *testing.T, b *Backend) { ran[b.Name] = true })
		t.Run("mini", func(t *testing.T) { ran["mini:"+Mini(t).Name] = true })
		if tc.env == "" {
			tc.want["mini:miniredis"] = true
		}
		if len(ran) != len(tc.want) {
			t.Errorf("%s=%q: ran %v, want %v", EnvRealOnly, tc.env, ran, tc.want)
		}
		for k := range tc.want {
			if !ran[k] {
				t.Errorf("%s=%q: ran %v, want %v", EnvRealOnly, tc.env, ran, tc.want)
			}
		}
	}
}
