package main

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
)

// durationFlag is one duration flag of a subcommand with the largest
// value it accepts: a library limit it feeds, or the largest duration for
// a flag that only sets a timer or a context's deadline (the next value
// up does not parse).
type durationFlag struct {
	cmd, flag string
	max       time.Duration
}

var durationFlags = []durationFlag{
	{"run", "w", math.MaxInt64},
	{"run", "ttl", fairlock.MaxTTL},
	{"run", "grace", math.MaxInt64},
	{"run", "max-hold", fairlock.MaxHoldLimit},
	{"elect", "w", math.MaxInt64},
	{"elect", "ttl", fairlock.MaxTTL},
	{"elect", "grace", math.MaxInt64},
	{"status", "watch", math.MaxInt64},
}

// durationVarCall matches a duration flag's definition in the command's
// source; its file names the subcommand.
var durationVarCall = regexp.MustCompile(`durationVar\(fs, &o\.\w+, "([a-z-]+)"`)

// Every duration flag of every subcommand is in durationFlags (read from
// the source, so a new one fails here until it joins): at its largest value
// the subcommand runs, and the next nanosecond up is refused with exit 64,
// naming the flag (and the limit, where a library limit bounds it).
func TestDurationFlagLimits(t *testing.T) {
	listed := map[string]bool{}
	for _, f := range durationFlags {
		listed[f.cmd+" -"+f.flag] = true
	}
	files, _ := filepath.Glob("*.go")
	found := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range durationVarCall.FindAllStringSubmatch(string(src), -1) {
			found++
			if name := strings.TrimSuffix(file, ".go") + " -" + m[1]; !listed[name] {
				t.Errorf("duration flag %s (%s) is not in durationFlags", name, file)
			}
		}
	}
	if found != len(durationFlags) {
		t.Errorf("the source defines %d duration flags, durationFlags lists %d", found, len(durationFlags))
	}

	c := newCLI(t)
	for _, f := range durationFlags {
		t.Run(f.cmd+"_"+f.flag, func(t *testing.T) {
			args := func(d string) []string {
				switch f.cmd {
				case "status":
					return []string{"-" + f.flag, d, "s"}
				default:
					return []string{"-" + f.flag, d, "free-" + f.cmd, "--", "true"}
				}
			}
			over := (f.max + 1).String()
			if f.max == math.MaxInt64 {
				over = "2562047h47m16.854775808s" // one nanosecond past the largest duration
			}
			r := runBin(t, nil, append([]string{f.cmd, "-redis", c.url, "-prefix", c.prefix}, args(over)...)...)
			if r.code != exitUsage || !strings.Contains(r.stderr, "-"+f.flag) ||
				(f.max != math.MaxInt64 && !strings.Contains(r.stderr, f.max.String())) {
				t.Errorf("%s -%s %s: exit %d, stderr %q; want %d naming the flag and its limit %v", f.cmd, f.flag, over, r.code, r.stderr, exitUsage, f.max)
			}
			if f.cmd != "status" {
				r := runBin(t, nil, append([]string{f.cmd, "-redis", c.url, "-prefix", c.prefix}, args(f.max.String())...)...)
				if r.code != 0 {
					t.Errorf("%s -%s %v: exit %d, stderr %q; want 0", f.cmd, f.flag, f.max, r.code, r.stderr)
				}
				return
			}
			// status -watch prints at once, then waits for the interval:
			// its first table is enough.
			cmd := c.cmd(f.cmd, args(f.max.String())...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || line == "" {
				t.Errorf("status -watch %v printed %q, %v; want its table", f.max, line, err)
			}
		})
	}
}
