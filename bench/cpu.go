package main

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTime is Redis's CPU time so far, read from INFO cpu.
type cpuTime struct {
	seconds float64
	// mainThread is true when seconds is used_cpu_user_main_thread +
	// used_cpu_sys_main_thread, false when the server lacks those fields
	// and seconds is the whole process's used_cpu_user + used_cpu_sys
	// (background threads included).
	mainThread bool
}

// parseCPU reads an INFO cpu reply. It prefers the main thread's user and
// system time and falls back to the process's where either main-thread
// field is missing. ok is false when the reply has neither pair (an
// embedded miniredis, a proxy), or a value that is not a number.
func parseCPU(info string) (t cpuTime, ok bool) {
	fields := map[string]string{}
	for _, l := range strings.Split(info, "\n") {
		if k, v, found := strings.Cut(strings.TrimSpace(l), ":"); found {
			fields[k] = v
		}
	}
	sum := func(a, b string) (float64, bool) {
		va, oka := fields[a]
		vb, okb := fields[b]
		if !oka || !okb {
			return 0, false
		}
		x, err1 := strconv.ParseFloat(va, 64)
		y, err2 := strconv.ParseFloat(vb, 64)
		if err1 != nil || err2 != nil {
			return 0, false
		}
		return x + y, true
	}
	if s, ok := sum("used_cpu_user_main_thread", "used_cpu_sys_main_thread"); ok {
		return cpuTime{seconds: s, mainThread: true}, true
	}
	if s, ok := sum("used_cpu_user", "used_cpu_sys"); ok {
		return cpuTime{seconds: s}, true
	}
	return cpuTime{}, false
}

// serverCPU reads Redis's CPU time; ok is false where INFO cpu does not
// say (miniredis) or the INFO call fails.
func (e *env) serverCPU() (cpuTime, bool) {
	info, err := e.admin.Info(context.Background(), "cpu").Result()
	if err != nil {
		return cpuTime{}, false
	}
	return parseCPU(info)
}

// selfCPU is this process's CPU time so far (user + system), in seconds:
// the clients' side of a measurement, since every implementation runs in
// this process (a redis-server that -redis auto started is a child, not
// counted).
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
