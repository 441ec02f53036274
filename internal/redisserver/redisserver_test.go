package redisserver

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// A set FAIRLOCK_REDIS_SERVER_DIR chooses the programs, and never falls
// back to PATH.
func TestBinaryFromEnvDir(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "redis-server")
	script := "#!/bin/sh\necho 'Valkey server v=9.9.9 sha=00000000:0 malloc=libc bits=64 build=0'\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvDir, dir)
	got, err := Binary("redis-server")
	if err != nil || got != fake {
		t.Fatalf("Binary(redis-server) = %q, %v; want %q", got, err, fake)
	}
	b, err := Which()
	if err != nil {
		t.Fatal(err)
	}
	if want := (Build{Name: "Valkey", Version: "9.9.9", Path: fake}); b != want {
		t.Errorf("Which() = %+v, want %+v", b, want)
	}
	// redis-cli is not in dir: an error, even when PATH has one.
	if _, err := Binary("redis-cli"); !errors.Is(err, os.ErrNotExist) && !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("Binary(redis-cli) from a folder without it: %v, want not found", err)
	}
}

// Which refuses a program whose --version is not Redis's or Valkey's.
func TestWhichUnrecognised(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "redis-server"), []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvDir, dir)
	if b, err := Which(); err == nil {
		t.Errorf("Which() = %+v, want an error", b)
	}
}

func TestFromInfo(t *testing.T) {
	for _, tc := range []struct {
		name, info string
		want       Build
		ok         bool
	}{
		{"redis", "# Server\r\nredis_version:7.4.1\r\nredis_mode:standalone\r\n", Build{Name: "Redis", Version: "7.4.1"}, true},
		{"valkey", "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\n", Build{Name: "Valkey", Version: "8.0.1"}, true},
		{"neither", "# Server\r\nfoo:1\r\n", Build{}, false},
	} {
		got, ok := FromInfo(tc.info)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: FromInfo = %+v, %v; want %+v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
