package main

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
)

// result is what one run of the binary did.
type result struct {
	stdout, stderr string
	code           int
}

// runBin runs the fairlock binary with args (and env added to the
// environment), as a user does, and fails the test if it runs past 20s.
func runBin(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cmd.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("fairlock %q still ran after 20s; stderr:\n%s", args, stderr.String())
	}
	return result{stdout.String(), stderr.String(), exitOf(err)}
}

// flagLine matches a flag's first line in a help text: "  -name ...".
var flagLine = regexp.MustCompile(`(?m)^  -([a-z][a-z-]*)\b`)

// flagsIn returns the flags a help text lists, sorted.
func flagsIn(help string) []string {
	var names []string
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

// "fairlock --help" (and -h, -help, help) prints to stdout, exits 0 and
// lists every flag of every command; "fairlock CMD -h" (and --help, and
// "fairlock help CMD") lists that command's flags only, to stdout, and
// exits 0.
func TestHelp(t *testing.T) {
	top := runBin(t, nil, "--help")
	if top.code != 0 || top.stderr != "" || !strings.HasPrefix(top.stdout, "usage:") {
		t.Fatalf("fairlock --help: exit %d, stderr %q, stdout:\n%s", top.code, top.stderr, top.stdout)
	}
	for _, args := range [][]string{{"-h"}, {"-help"}, {"help"}} {
		if r := runBin(t, nil, args...); r.code != 0 || r.stdout != top.stdout || r.stderr != "" {
			t.Fatalf("fairlock %s: exit %d, stderr %q; stdout differs from --help's: %v", args[0], r.code, r.stderr, r.stdout != top.stdout)
		}
	}
	common := []string{"cluster", "master", "prefix", "redis", "sentinel", "v"}
	own := map[string][]string{
		"run":    {"capacity", "grace", "max-hold", "n", "permits", "ttl", "w"},
		"elect":  {"grace", "ttl", "value", "w"},
		"status": {"json", "kind", "watch"},
	}
	listed := flagsIn(top.stdout)
	for name, flags := range own {
		want := slices.Sorted(slices.Values(append(slices.Clone(common), flags...)))
		h := runBin(t, nil, name, "-h")
		if h.code != 0 || h.stderr != "" {
			t.Fatalf("fairlock %s -h: exit %d, stderr:\n%s", name, h.code, h.stderr)
		}
		if !strings.HasPrefix(h.stdout, "usage: fairlock "+name+" ") {
			t.Fatalf("fairlock %s -h does not start with its usage line:\n%s", name, h.stdout)
		}
		if got := flagsIn(h.stdout); !slices.Equal(got, want) {
			t.Fatalf("fairlock %s -h lists flags %v, want %v:\n%s", name, got, want, h.stdout)
		}
		for _, args := range [][]string{{name, "--help"}, {name, "-help"}, {"help", name}} {
			if r := runBin(t, nil, args...); r.code != 0 || r.stdout != h.stdout {
				t.Fatalf("fairlock %q: exit %d, stdout differs from %s -h's:\n%s", args, r.code, name, r.stdout)
			}
		}
		// Every flag the command takes is in fairlock --help.
		for _, f := range want {
			if !slices.Contains(listed, f) {
				t.Fatalf("fairlock --help lacks -%s (a flag of %s); it lists %v", f, name, listed)
			}
		}
		// A flag fairlock --help lists under the command is one it takes.
		section := top.stdout[strings.Index(top.stdout, "Flags of "+name+":"):]
		if i := strings.Index(section[1:], "\nFlags of "); i >= 0 {
			section = section[:i+1]
		} else if i := strings.Index(section, "\n\n"); i >= 0 {
			section = section[:i]
		}
		for _, f := range flagsIn(section) {
			if !slices.Contains(flags, f) {
				t.Fatalf("fairlock --help lists -%s under %s, which takes %v", f, name, flags)
			}
		}
	}
}

// An unknown command or flag, or missing arguments, exit 64 with the usage
// on stderr and nothing on stdout.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // in stderr
	}{
		{nil, []string{"usage:"}},
		{[]string{"bogus"}, []string{`unknown command "bogus"`, "usage:", "fairlock --help"}},
		{[]string{"-x"}, []string{`unknown command "-x"`, "usage:"}},
		{[]string{"help", "bogus"}, []string{`unknown command "bogus"`, "usage:"}},
		{[]string{"run", "-bogus", "x", "--", "true"}, []string{"flag provided but not defined: -bogus", "usage: fairlock run "}},
		{[]string{"status", "-json"}, []string{"want at least one NAME", "usage: fairlock status "}},
		{[]string{"elect", "x", "true"}, []string{"want NAME -- COMMAND", "usage: fairlock elect "}},
		{[]string{"run", "x", "-n", "--", "true"}, []string{"-n after NAME", "flags go before NAME", "usage: fairlock run "}},
		{[]string{"run", "-w", "soon", "x", "--", "true"}, []string{`invalid value "soon" for flag -w`, "seconds such as 30 or 2.5"}},
		{[]string{"run", "-w", "-1s", "x", "--", "true"}, []string{"-w -1s is negative"}},
		{[]string{"status", "-watch", "-1s", "x"}, []string{"-watch -1s is negative"}},
	} {
		r := runBin(t, nil, tc.args...)
		if r.code != exitUsage || r.stdout != "" {
			t.Errorf("fairlock %q: exit %d, stdout %q; want %d and nothing", tc.args, r.code, r.stdout, exitUsage)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("fairlock %q: stderr lacks %q:\n%s", tc.args, s, r.stderr)
				break
			}
		}
	}
}

// "fairlock --version" (and -version, -V, version) prints the version the
// binary was built as, with the revision of a checkout, and exits 0.
func TestVersion(t *testing.T) {
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var mod, rev string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "mod":
			mod = f[2]
		case len(f) >= 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs.revision="):
			rev = strings.TrimPrefix(f[1], "vcs.revision=")[:12]
		}
	}
	if mod == "" {
		t.Fatalf("go version -m shows no module version:\n%s", out)
	}
	t.Logf("built as %s, revision %q", mod, rev)
	for _, arg := range []string{"--version", "-version", "-V", "version"} {
		r := runBin(t, nil, arg)
		line := strings.TrimSuffix(r.stdout, "\n")
		if r.code != 0 || r.stderr != "" || strings.Contains(line, "\n") || !strings.HasPrefix(line, "fairlock "+fairlock.Version+" "+mod) || !strings.Contains(line, rev) {
			t.Fatalf("fairlock %s: exit %d, stderr %q, stdout %q; want one line: fairlock %s, revision %q", arg, r.code, r.stderr, r.stdout, mod, rev)
		}
	}
}

// The version line of a build from a checkout names its revision once, and
// whether the tree was modified.
func TestVersionOf(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "ef3352bc9f776e98fb3d285c6c442e96f12fb2fc"
	for _, tc := range []struct {
		version  string
		settings []debug.BuildSetting
		want     string
	}{
		{"", nil, "fairlock " + fairlock.Version + " (devel) go1.26.8"},
		{"(devel)", nil, "fairlock " + fairlock.Version + " (devel) go1.26.8"},
		{"(devel)", vcs(rev, "false"), "fairlock " + fairlock.Version + " (devel) ef3352bc9f77 go1.26.8"},
		{"(devel)", vcs(rev, "true"), "fairlock " + fairlock.Version + " (devel) ef3352bc9f77+dirty go1.26.8"},
		{"v0.0.0-20261126093319-ef3352bc9f77", vcs(rev, "false"), "fairlock " + fairlock.Version + " v0.0.0-20261126093319-ef3352bc9f77 go1.26.8"},
		{"v0.0.0-20261126093319-ef3352bc9f77+dirty", vcs(rev, "true"), "fairlock " + fairlock.Version + " v0.0.0-20261126093319-ef3352bc9f77+dirty go1.26.8"},
		{"v0.1.0", nil, "fairlock v0.1.0 go1.26.8"},
		{"v1.2.3", nil, "fairlock v1.2.3 go1.26.8"},
	} {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fairlock/fairlock", Version: tc.version}, Settings: tc.settings}
		if got := versionOf(bi); got != tc.want {
			t.Errorf("version %q, settings %v: %q, want %q", tc.version, tc.settings, got, tc.want)
		}
	}
}
