//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package main

import (
	"os"
	"syscall"
)

// On macOS and the BSDs the supervisor is no subreaper and
// COMMAND has no parent-death signal: the supervisor reaches COMMAND and
// its process group only, and if the supervisor itself is killed by
// SIGKILL, COMMAND runs on.

func becomeSubreaper() bool { return false }

func parentDeathSignal(*syscall.SysProcAttr) {}

func children() []int { return nil }

func self() (string, error) { return os.Executable() }
