package fairlock

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The README's quickstart is examples/quickstart, which go vet and go
// build check; this keeps the two identical.
func TestReadmeQuickstart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	code, err := os.ReadFile("examples/quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(code)+"```\n") {
		t.Fatal("README.md does not contain examples/quickstart/main.go verbatim in a go block")
	}
}

// The README names two commands, the main job and every test; the second
// is what CI runs (.ci/run) and what CONTRIBUTING.md calls the full suite,
// word for word.
func TestReadmeTestCommandIsCIs(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	block := regexp.MustCompile("(?s)## Working on fairlock: the two commands\n.*?```sh\n(.*?)```").FindStringSubmatch(read("README.md"))
	if block == nil {
		t.Fatal("README.md has no sh block under \"Working on fairlock: the two commands\"")
	}
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(block[1]), "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	if len(cmds) != 2 || cmds[0] != "go -C bench run ." {
		t.Fatalf("README.md's two commands are %q, want the main job (go -C bench run .) and every test", cmds)
	}
	test := cmds[1]
	if !regexp.MustCompile("(?m)^" + regexp.QuoteMeta(test) + " \\|\\| exit 1$").MatchString(read(".ci/run")) {
		t.Errorf(".ci/run does not run the README's test command %q (followed by || exit 1)", test)
	}
	if !strings.Contains(read("CONTRIBUTING.md"), "\n"+test+"  # the full suite") {
		t.Errorf("CONTRIBUTING.md's full suite is not the README's test command %q", test)
	}
}

// CONTRIBUTING.md's Layout table names every folder of the tree (top
// level, and one level down in cmd, examples and internal), and every path
// it names exists.
func TestContributingLayout(t *testing.T) {
	readme, err := os.ReadFile("CONTRIBUTING.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("CONTRIBUTING.md has no Layout section")
	}
	layout, _, _ = strings.Cut(layout, "\n## ")
	// The first column of each row, its code spans.
	named := map[string]bool{}
	for line := range strings.Lines(layout) {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		parts := strings.Split(cells[1], "`")
		for i := 1; i < len(parts); i += 2 {
			named[parts[i]] = true
		}
	}
	for p := range named {
		if strings.Contains(p, "*") {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("Layout names %s: %v", p, err)
		}
	}
	var dirs []string
	for _, parent := range []string{".", "cmd", "examples", "internal"} {
		entries, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			// testdata holds rapid's fail files, which git ignores.
			if !e.IsDir() || e.Name() == ".git" || e.Name() == "testdata" {
				continue
			}
			d := e.Name() + "/"
			if parent != "." {
				d = parent + "/" + d
			}
			if d == "cmd/" || d == "examples/" || d == "internal/" {
				continue // their folders are named one by one
			}
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if !named[d] {
			t.Errorf("CONTRIBUTING.md's Layout table does not name %s", d)
		}
	}
}

// docs returns the project's Markdown documents.
func docs(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "bench/README.md"}
	more, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(files, more...)
}

// Every Go snippet of the documents is compiled: each is a program under
// examples/ verbatim, which go vet and go build check.
func TestDocsSnippetsCompiled(t *testing.T) {
	programs, err := filepath.Glob("examples/*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	// The Backends' modules compile their own (go vet ./... there).
	more, err := filepath.Glob("fairlock*/examples/*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	programs = append(programs, more...)
	compiled := map[string]bool{}
	for _, p := range programs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		compiled[string(b)] = true
	}
	for _, f := range docs(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rest := string(b)
		for {
			_, after, ok := strings.Cut(rest, "```go\n")
			if !ok {
				break
			}
			code, tail, _ := strings.Cut(after, "```\n")
			if !compiled[code] {
				first, _, _ := strings.Cut(code, "\n")
				t.Errorf("%s: a Go snippet that is no program under examples/ (it starts %q)", f, first)
			}
			rest = tail
		}
	}
}

// Every relative link of the documents points to a file that exists, and
// an anchor to a heading of it.
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range docs(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			if path == "" {
				path = f
			} else {
				path = filepath.Join(filepath.Dir(f), path)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if anchor == "" || st.IsDir() {
				continue
			}
			doc, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(anchors(string(doc)), anchor) {
				t.Errorf("%s: link %s: %s has no heading #%s", f, target, path, anchor)
			}
		}
	}
}

// anchors returns the anchors of a Markdown document's headings, as
// GitHub makes them: lower case, spaces to hyphens, punctuation dropped.
func anchors(doc string) []string {
	var out []string
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// The README's figures come from the run bench/README.md reports: the
// README names that run's id, which bench/README.md's report carries.
func TestReadmeFiguresAreTheBenchRun(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	bench, err := os.ReadFile("bench/README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("run id `([A-Z0-9]{8})`").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md's figures name no run id (run id `XXXXXXXX`)")
	}
	if !strings.Contains(string(bench), "- run id: "+string(m[1])+"\n") {
		t.Fatalf("README.md's figures come from run %s, which bench/README.md does not report", m[1])
	}
	// The summary rows are pasted as the bench printed them.
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| ") && strings.Contains(line, " µs") && !strings.Contains(string(bench), line) {
			t.Errorf("README.md's figure row is not in bench/README.md's run:\n%s", line)
		}
	}
}
