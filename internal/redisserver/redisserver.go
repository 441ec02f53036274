// Package redisserver starts and stops redis-server processes on free
// loopback ports, for fairlock's tests and benchmark harness.
//
// The programs (redis-server, redis-cli) come from the folder named by the
// environment variable FAIRLOCK_REDIS_SERVER_DIR when it is set, and from
// PATH otherwise; Which names the server that runs (Redis or Valkey, and
// its version).
package redisserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process on a loopback port.
type Server struct {
	Addr string
	Port int
	Args []string
	cmd  *exec.Cmd
	dir  string
	conf string // a sentinel's configuration file; "" for a plain server
}

// EnvDir is the environment variable naming the folder that holds the
// redis-server and redis-cli to run (Redis's or Valkey's); when it is
// unset or empty they come from PATH.
const EnvDir = "FAIRLOCK_REDIS_SERVER_DIR"

// Binary returns the path of program name (redis-server, redis-cli): the
// file of that name in $FAIRLOCK_REDIS_SERVER_DIR when the variable is
// set, else the one on PATH. It fails when the program is not there or is
// not executable; a set variable never falls back to PATH, so a run meant
// for one server never silently tests another.
func Binary(name string) (string, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return exec.LookPath(name)
	}
	path, err := exec.LookPath(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvDir, dir, err)
	}
	return filepath.Abs(path)
}

// Build names a server program: Name is "Redis" or "Valkey", Version its
// release ("7.4.1"), Path the program run ("" when read from a running
// server's INFO).
type Build struct {
	Name, Version, Path string
}

// String returns "Valkey 8.0.1", followed by the path in parentheses when
// known.
func (b Build) String() string {
	s := b.Name + " " + b.Version
	if b.Path != "" {
		s += " (" + b.Path + ")"
	}
	return s
}

// versionLine matches the first line of `redis-server --version`:
// "Redis server v=7.4.1 sha=..." or "Valkey server v=8.0.1 sha=...".
var versionLine = regexp.MustCompile(`^(\S+) server v=(\S+)`)

// Which returns the redis-server that Start runs, named by its own
// --version output. It fails when there is none (see Binary), when it does
// not run, or when its output is not the one Redis and Valkey print.
func Which() (Build, error) {
	path, err := Binary("redis-server")
	if err != nil {
		return Build{}, err
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return Build{}, fmt.Errorf("%s --version: %w", path, err)
	}
	m := versionLine.FindStringSubmatch(string(out))
	if m == nil {
		return Build{}, fmt.Errorf("%s --version: unrecognised output %q", path, out)
	}
	return Build{Name: m[1], Version: m[2], Path: path}, nil
}

// FromInfo names a running server from its INFO server section: Valkey
// reports server_name:valkey and valkey_version (its redis_version is the
// Redis release it is compatible with); Redis reports only redis_version.
// ok is false when the reply has neither.
func FromInfo(info string) (b Build, ok bool) {
	field := func(name string) string {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
				return v
			}
		}
		return ""
	}
	if v := field("valkey_version"); v != "" || field("server_name") == "valkey" {
		return Build{Name: "Valkey", Version: v}, v != ""
	}
	if v := field("redis_version"); v != "" {
		return Build{Name: "Redis", Version: v}, true
	}
	return Build{}, false
}

// Start runs redis-server (see Binary) on a free loopback port (never
// 6379) with persistence off, plus any extra arguments, and waits up to 5
// seconds until it answers. It fails, leaving no process behind, when
// there is no redis-server or it does not start after 5 tries on fresh
// ports; the error then carries the server's log.
func Start(args ...string) (*Server, error) {
	if _, err := Binary("redis-server"); err != nil {
		return nil, err
	}
	return onFreePort(5, nil, func(port int) (*Server, error) {
		s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, Args: args}
		if err := s.start(); err != nil {
			s.Stop()
			return nil, err
		}
		return s, nil
	})
}

// onFreePort runs start on fresh free loopback ports until a server starts,
// up to tries times (another process can take a port between freePort and
// the server's bind), and returns it, or the last error. A port that
// usable (when not nil) refuses is skipped, and counts as a try. A start
// that fails must leave nothing behind (its process and directory).
func onFreePort(tries int, usable func(port int) bool, start func(port int) (*Server, error)) (*Server, error) {
	last := fmt.Errorf("no usable free port in %d tries", tries)
	for range tries {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		if usable != nil && !usable(port) {
			continue
		}
		s, err := start(port)
		if err == nil {
			return s, nil
		}
		last = err
	}
	return nil, last
}

func (s *Server) start() error {
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "redistest")
		if err != nil {
			return err
		}
		s.dir = dir
	}
	args := append([]string{
		"--port", fmt.Sprint(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no",
	}, s.Args...)
	if s.conf != "" {
		args = []string{s.conf, "--sentinel"}
	}
	bin, err := Binary("redis-server")
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Keep draining the server's log so it never blocks on a full pipe.
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		err := c.Ping(context.Background()).Err()
		if err != nil && strings.HasPrefix(err.Error(), "NOAUTH") {
			// A server with a password answers NOAUTH: it is up (and
			// tells nobody its process without the password).
			return nil
		}
		if err == nil {
			// The port was free when it was picked, but another
			// process may have taken it since (its own free port):
			// then this server could not listen, and the one that
			// answers is the other's.
			if pid, ok := processID(c); ok && pid != cmd.Process.Pid {
				s.kill()
				return fmt.Errorf("%w: %s answers from process %d, not from the server started (%d)", errPortTaken, s.Addr, pid, cmd.Process.Pid)
			}
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	var log []string
	for l := range lines {
		log = append(log, l)
	}
	return fmt.Errorf("redis-server on %s did not start: %s", s.Addr, strings.Join(log, "\n"))
}

// errPortTaken says that a server's port was taken by another process
// before the server could listen on it.
var errPortTaken = errors.New("port taken by another process")

// processID returns the process id the server c reaches reports (INFO
// server's process_id), if it says.
func processID(c *redis.Client) (int, bool) {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			return pid, err == nil
		}
	}
	return 0, false
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Kill kills the server (SIGKILL) and keeps its port and directory, so
// Restart can bring it back where it was.
func (s *Server) Kill() { s.kill() }

// Pause stops the server's process (SIGSTOP): it keeps its port and its
// connections, and the kernel still accepts new ones, but it answers
// nothing until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(sig)
}

// Restart starts the server again on the same port, after Kill.
func (s *Server) Restart() error { return s.start() }

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.kill()
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if port == 6379 {
		return freePort()
	}
	return port, nil
}
