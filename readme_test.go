package fairlock

import (
	"os"
	"strings"
	"testing"
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

// The README's Layout table names every folder of the tree (top level, and
// one level down in cmd, examples and internal), and every path it names
// exists.
func TestReadmeLayout(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
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
			t.Errorf("the README's Layout table does not name %s", d)
		}
	}
}
