// Package modcheck checks that fairlock's modules install as a user's
// program gets them: from a module proxy, at a version, with no replace
// directive and no workspace.
package modcheck

import (
	"archive/zip"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
)

// modules are the repository's modules a user may require: their
// directories (relative to the repository's root) and paths. The
// benchmark harness is not published.
var modules = []struct{ dir, path string }{
	{".", "github.com/fairlock/fairlock"},
	{"fairlockrueidis", "github.com/fairlock/fairlock/fairlockrueidis"},
	{"fairlockvalkey", "github.com/fairlock/fairlock/fairlockvalkey"},
	{"fairlockotel", "github.com/fairlock/fairlock/fairlockotel"},
}

// consumer is a program that uses every published module.
const consumer = `package main

import (
	"fmt"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockotel"
	"github.com/fairlock/fairlock/fairlockrueidis"
	"github.com/fairlock/fairlock/fairlockvalkey"
	"github.com/fairlock/fairlock/semaphore"
)

func main() {
	fmt.Println(fairlock.Version, fairlock.New != nil, semaphore.NewMutex != nil,
		fairlockrueidis.New != nil, fairlockvalkey.New != nil, fairlockotel.New != nil)
}
`

// TestConsumerBuildsFromAProxy serves this checkout's modules at
// fairlock.Version from a module proxy in a directory (the layout the go
// command reads through GOPROXY=file://...), then builds and runs, outside
// the repository, a program that requires them by that version with no
// replace directive and no workspace: what a user who runs go get sees
// once the version is tagged. Its other dependencies come from the
// machine's module cache or its usual proxy.
func TestConsumerBuildsFromAProxy(t *testing.T) {
	redistest.Long(t)
	if redistest.RealOnly() {
		// It meets no server: the run without FAIRLOCK_REAL_ONLY ran it.
		t.Skip("FAIRLOCK_REAL_ONLY: the build meets no server")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	root := repoRoot(t)
	proxy := t.TempDir()
	for _, m := range modules {
		serve(t, proxy, filepath.Join(root, m.dir), m.path, fairlock.Version)
	}

	env := func(extra ...string) []string {
		cache, _ := exec.Command(goBin, "env", "GOMODCACHE").Output()
		upstream, _ := exec.Command(goBin, "env", "GOPROXY").Output()
		via := "file://" + filepath.ToSlash(proxy)
		if c := strings.TrimSpace(string(cache)); c != "" {
			// The machine's module cache serves as a proxy too (offline).
			via += ",file://" + filepath.ToSlash(filepath.Join(c, "cache", "download"))
		}
		if u := strings.TrimSpace(string(upstream)); u != "" && u != "off" {
			via += "," + u
		}
		e := append(os.Environ(),
			"GOPROXY="+via,
			// A fresh module cache: this checkout's modules must come from
			// the proxy above, never from an earlier run's copy.
			"GOMODCACHE="+filepath.Join(t.TempDir(), "mod"),
			"GOFLAGS=-mod=mod -modcacherw",
			"GONOSUMDB=github.com/fairlock",
			"GOWORK=off",
			"GOTOOLCHAIN=local",
		)
		return append(e, extra...)
	}
	dir := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = dir, env()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(consumer), 0o644); err != nil {
		t.Fatal(err)
	}
	run("mod", "init", "example.com/consumer")
	for _, m := range modules {
		run("get", m.path+"@"+fairlock.Version)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(gomod), "replace") {
		t.Fatalf("the consumer's go.mod has a replace directive:\n%s", gomod)
	}
	run("build", "-o", "consumer", ".")
	bin := exec.Command(filepath.Join(dir, "consumer"))
	out, err := bin.Output()
	if err != nil {
		t.Fatalf("the consumer: %v", err)
	}
	got := string(out)
	if want := fairlock.Version + " true true true true true"; strings.TrimSpace(got) != want {
		t.Fatalf("the consumer printed %q, want %q", got, want)
	}
}

// TestModulesRequireTheVersion checks that every module that requires the
// root module (or another of fairlock's) requires it at fairlock.Version,
// which the workspace (go.work) replaces by the checkout for development:
// a module that required a version that was never published (v0.0.0)
// could not be installed.
func TestModulesRequireTheVersion(t *testing.T) {
	root := repoRoot(t)
	dirs := []string{"bench", "fairlockotel", "fairlockrueidis", "fairlockvalkey"}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(root, d, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
			if strings.HasPrefix(strings.TrimSpace(line), "replace ") {
				t.Errorf("%s/go.mod: %q: a replace directive is ignored in a dependency; the workspace (go.work) replaces for development", d, line)
			}
			if len(f) >= 2 && strings.HasPrefix(f[0], "github.com/fairlock/fairlock") && f[1] != fairlock.Version {
				t.Errorf("%s/go.mod requires %s %s, want %s (fairlock.Version)", d, f[0], f[1], fairlock.Version)
			}
		}
	}
	work, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range modules[:3] {
		if want := m.path + " " + fairlock.Version + " => "; !strings.Contains(string(work), want) {
			t.Errorf("go.work does not replace %s %s by the checkout", m.path, fairlock.Version)
		}
	}
}

// repoRoot returns the repository's root: two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("no go.work at %s: %v", root, err)
	}
	return root
}

// serve writes module path at version, from its directory dir, into proxy
// in the layout of a module proxy: @v/list, .info, .mod and .zip. The zip
// holds the module's files as git tracks them, less those of modules
// nested in it, each under path@version/.
func serve(t *testing.T, proxy, dir, path, version string) {
	t.Helper()
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--", ".").Output()
	if err != nil {
		t.Skipf("git ls-files in %s: %v (the check needs git and a checkout)", dir, err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	nested := map[string]bool{}
	for _, f := range files {
		if d := filepath.Dir(f); filepath.Base(f) == "go.mod" && d != "." {
			nested[d] = true
		}
	}
	at := filepath.Join(proxy, filepath.FromSlash(path), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	zf, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(zf)
	inNested := func(f string) bool {
		for d := filepath.Dir(f); d != "." && d != "/"; d = filepath.Dir(d) {
			if nested[d] {
				return true
			}
		}
		return false
	}
	for _, f := range files {
		if f == "" || inNested(f) || f == "go.work" || f == "go.work.sum" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(path + "@" + version + "/" + filepath.ToSlash(f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zf.Close(); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]string{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	for name, b := range map[string][]byte{version + ".mod": mod, version + ".info": info, "list": []byte(version + "\n")} {
		if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
			t.Fatal(fmt.Errorf("proxy: %w", err))
		}
	}
}

// TestChangelogNamesTheVersion checks that the newest release CHANGELOG.md
// names is fairlock.Version.
func TestChangelogNamesTheVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, ok := strings.CutPrefix(line, "## [")
		if !ok || strings.HasPrefix(v, "Unreleased]") {
			continue
		}
		v, _, _ = strings.Cut(v, "]")
		if "v"+v != fairlock.Version {
			t.Fatalf("CHANGELOG.md's newest release is %s, fairlock.Version %s", v, fairlock.Version)
		}
		return
	}
	t.Fatal("CHANGELOG.md names no release")
}
