package main

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
)

// status -watch rides out a Redis restart, off a terminal and on one: it
// says it cannot reach Redis, keeps trying, and prints again once Redis is
// back; only SIGINT ends it (status 0).
func TestStatusWatchRidesOutRestart(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			srv, err := redisserver.Start()
			if err != nil {
				t.Skipf("no redis-server: %v", err)
			}
			defer srv.Stop()
			cmd := exec.Command(bin, "status", "-watch", "100ms", "-redis", "redis://"+srv.Addr, "-prefix", redistest.Prefix(t), "w")
			var out func() string
			if mode == "terminal" {
				m, s := openPTY(t)
				scr := readScreen(m)
				cmd.Stdout, cmd.Stderr = s, s
				out = scr.String
			} else {
				var buf syncBuffer
				cmd.Stdout, cmd.Stderr = &buf, &buf
				out = buf.String
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer cmd.Process.Kill()

			// await waits until what follows from in the output holds s,
			// and returns where it ends; it fails if status exits.
			await := func(what string, from int, s string) int {
				t.Helper()
				deadline := time.After(20 * time.Second)
				for {
					if i := strings.Index(out()[from:], s); i >= 0 {
						return from + i + len(s)
					}
					select {
					case err := <-exited:
						t.Fatalf("status -watch exited (%v) waiting for %s; output:\n%s", err, what, out())
					case <-deadline:
						t.Fatalf("no %s (%q) in 20s; output:\n%s", what, s, out())
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			at := await("the first table", 0, "w: idle")
			srv.Kill()
			at = await("the line saying Redis is out of reach", at, "fairlock: cannot reach Redis, trying again every 100ms: ")
			if strings.Contains(out()[at:], "w: idle") {
				t.Fatalf("a table printed while Redis was down:\n%s", out())
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			await("a table once Redis is back", at, "w: idle")
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if exitOf(err) != 0 {
					t.Fatalf("status -watch ended by SIGINT: %v, want status 0", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("status -watch did not end on SIGINT")
			}
			t.Logf("output:\n%s", strings.ReplaceAll(out(), "\033[H\033[2J", "<clear>"))
			if mode == "terminal" != strings.Contains(out(), "\033[2J") {
				t.Fatalf("%s: the screen is cleared: %v; output:\n%q", mode, strings.Contains(out(), "\033[2J"), out())
			}
		})
	}
}

// A bad NAME ends status -watch at once with status 64: it is no passing
// failure to wait out.
func TestStatusWatchBadName(t *testing.T) {
	c := newCLI(t)
	cmd := c.cmd("status", "-watch", "100ms", "{x}")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	done := make(chan int, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- exitOf(cmd.Wait()) }()
	select {
	case got := <-done:
		if got != exitUsage || !strings.HasPrefix(stderr.String(), "fairlock: invalid name") {
			t.Fatalf("status -watch with a bad name exited %d, want %d; stderr: %s", got, exitUsage, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("status -watch with a bad name still runs after 10s")
	}
}
