package redisserver

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
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

// A server whose port another process took between freePort and its
// start cannot listen: start says so, rather than taking the other
// process's answers for its own, and leaves that process be. (CI once
// saw a sentinel "start" this way, then refuse connections once the
// other test's server on its port stopped.)
func TestStartRefusesAPortTakenByAnother(t *testing.T) {
	if _, err := Binary("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	first, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Stop()
	second := &Server{Addr: first.Addr, Port: first.Port}
	err = second.start()
	second.Stop()
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("start on %s, which another server holds: %v, want errPortTaken", first.Addr, err)
	}
	c := redis.NewClient(&redis.Options{Addr: first.Addr})
	defer c.Close()
	if pid, ok := processID(c); !ok || pid != first.cmd.Process.Pid {
		t.Errorf("the server that held the port: process %d (%v), want %d", pid, ok, first.cmd.Process.Pid)
	}
}
