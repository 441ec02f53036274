package fairlock_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/latch"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// Every default and limit the docs state is read from them and checked
// against the code, so that changing one without the other fails here:
// the guide's Limits table (which must name every exported default and
// limit of the library's packages), and the sentences of the guide, the
// README and the doc comments that state one.

// limitValues are the code's defaults and limits by the name the guide's
// Limits table gives them: an exported constant, or, for a limit the
// code keeps unexported, the option it bounds (probed through New).
func limitValues(t *testing.T) map[string]any {
	return map[string]any{
		"fairlock.DefaultPrefix":        fairlock.DefaultPrefix,
		"fairlock.DefaultLeaseTTL":      fairlock.DefaultLeaseTTL,
		"fairlock.DefaultWaiterTTL":     fairlock.DefaultWaiterTTL,
		"fairlock.MaxTTL":               fairlock.MaxTTL,
		"fairlock.MaxHoldLimit":         fairlock.MaxHoldLimit,
		"fairlock.MaxNameLen":           int64(fairlock.MaxNameLen),
		"fairlock.MaxCapacity":          int64(fairlock.MaxCapacity),
		"fairlock.MaxResources":         int64(fairlock.MaxResources),
		"fairlock.StatusMax":            int64(fairlock.StatusMax),
		"fairlock.MaxBatch":             int64(fairlock.MaxBatch),
		"semaphore.MaxReaders":          int64(semaphore.MaxReaders),
		"election.MaxValueLen":          int64(election.MaxValueLen),
		"latch.MaxCount":                int64(latch.MaxCount),
		"latch.DefaultTTL":              latch.DefaultTTL,
		"latch.MaxTTL":                  latch.MaxTTL,
		"barrier.MaxParties":            int64(barrier.MaxParties),
		"barrier.DefaultTTL":            barrier.DefaultTTL,
		"barrier.MaxTTL":                barrier.MaxTTL,
		"WithPrefix":                    longestAccepted(t, func(n int64) []fairlock.Option { return opts(fairlock.WithPrefix(strings.Repeat("p", int(n)))) }),
		"WithOwner":                     longestAccepted(t, func(n int64) []fairlock.Option { return opts(fairlock.WithOwner(strings.Repeat("o", int(n)))) }),
		"WithLeaseTTL`, `WithWaiterTTL": shortestTTL(t),
		"WithReplicaAck": shortestAccepted(t, func(d time.Duration) []fairlock.Option {
			return opts(fairlock.WithReplicaAck(1, d))
		}),
	}
}

func opts(o ...fairlock.Option) []fairlock.Option { return o }

func accepted(o []fairlock.Option) bool {
	_, err := fairlock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), o...)
	return err == nil
}

// longestAccepted returns the largest n, up to 1<<20, that New accepts
// with the options of(n), New refusing n+1.
func longestAccepted(t *testing.T, of func(n int64) []fairlock.Option) int64 {
	lo, hi := int64(0), int64(1<<20) // accepted, refused
	if !accepted(of(lo)) || accepted(of(hi)) {
		t.Fatalf("the probe's range [0, %d] does not hold the limit", hi)
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if accepted(of(mid)) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// shortestAccepted returns the shortest duration, to the microsecond,
// that New accepts with the options of(d), New refusing it less 1µs.
func shortestAccepted(t *testing.T, of func(d time.Duration) []fairlock.Option) time.Duration {
	lo, hi := time.Duration(0), time.Second/time.Microsecond // in µs: refused, accepted
	if accepted(of(lo)) || !accepted(of(hi*time.Microsecond)) {
		t.Fatalf("the probe's range [0, %v] does not hold the limit", hi*time.Microsecond)
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if accepted(of(mid * time.Microsecond)) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi * time.Microsecond
}

// shortestTTL returns the shortest lease TTL New accepts, after checking
// that the waiter TTL's is the same, as the guide states one for both.
func shortestTTL(t *testing.T) time.Duration {
	lease := shortestAccepted(t, func(d time.Duration) []fairlock.Option { return opts(fairlock.WithLeaseTTL(d)) })
	waiter := shortestAccepted(t, func(d time.Duration) []fairlock.Option { return opts(fairlock.WithWaiterTTL(d)) })
	if lease != waiter {
		t.Errorf("shortest lease TTL %v, shortest waiter TTL %v: the guide states one value for both", lease, waiter)
	}
	return lease
}

// docValue parses a value as the docs write it ("10s", "3 s", "24h",
// "365 days", "4,096 bytes", "1125899906842624 (2^50)", "fairlock:") into
// what the code's value is: a duration, a number, or the string itself.
func docValue(s string, like any) (any, error) {
	s = strings.TrimSpace(strings.Trim(strings.TrimSpace(s), "`"))
	switch like.(type) {
	case string:
		return s, nil
	case time.Duration:
		if m := regexp.MustCompile(`^(\d+) days?\b`).FindStringSubmatch(s); m != nil {
			n, _ := strconv.Atoi(m[1])
			return time.Duration(n) * 24 * time.Hour, nil
		}
		f := strings.Fields(s)
		v := f[0]
		if len(f) > 1 && regexp.MustCompile(`^\d+$`).MatchString(f[0]) {
			v = f[0] + f[1] // "3 s"
		}
		return time.ParseDuration(v)
	case int64:
		return strconv.ParseInt(strings.ReplaceAll(strings.Fields(s)[0], ",", ""), 10, 64)
	}
	return nil, fmt.Errorf("no parser for %T", like)
}

// limitsTable returns the rows of the guide's Limits table: the "in the
// code" cell (without its outer backquotes) and the value cell.
func limitsTable(t *testing.T) [][2]string {
	src, err := os.ReadFile("docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(src), "\n### Limits\n")
	if !ok {
		t.Fatal("docs/guide.md has no Limits section")
	}
	var rows [][2]string
	for _, line := range strings.Split(sec, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 3 || cells[0] == "what" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows = append(rows, [2]string{strings.Trim(cells[2], "`"), cells[1]})
	}
	if len(rows) == 0 {
		t.Fatal("the guide's Limits table has no rows")
	}
	return rows
}

// The guide's Limits table states each value as the code has it, and
// names every exported default and limit of the library's packages.
func TestDocsLimitsTable(t *testing.T) {
	values := limitValues(t)
	named := map[string]bool{}
	for _, row := range limitsTable(t) {
		name, cell := row[0], row[1]
		named[name] = true
		want, ok := values[name]
		if !ok || want == nil {
			t.Errorf("the Limits table names %q, which the test does not know: add its value to limitValues", name)
			continue
		}
		got, err := docValue(cell, want)
		if err != nil || got != want {
			t.Errorf("the Limits table says %s is %q (%v, %v); the code has %v", name, cell, got, err, want)
		}
	}
	for _, name := range exportedLimits(t) {
		if !named[name] {
			t.Errorf("%s is not in the guide's Limits table", name)
		}
	}
}

// exportedLimits returns the exported constants named Default* or Max*
// (or *Max) of the library's packages, qualified.
func exportedLimits(t *testing.T) []string {
	var out []string
	for dir, pkg := range map[string]string{".": "fairlock", "semaphore": "semaphore", "multilock": "multilock", "election": "election", "latch": "latch", "barrier": "barrier"} {
		for _, d := range declsOf(t, dir) {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if n.IsExported() && (strings.HasPrefix(n.Name, "Default") || strings.HasPrefix(n.Name, "Max") || strings.HasSuffix(n.Name, "Max")) {
						out = append(out, pkg+"."+n.Name)
					}
				}
			}
		}
	}
	if len(out) < 8 {
		t.Fatalf("found only %v: the scan is broken", out)
	}
	return out
}

func declsOf(t *testing.T, dir string) []ast.Decl {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	var decls []ast.Decl
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, file.Decls...)
	}
	return decls
}

// docComment returns the doc comment of the declaration name (a function,
// a type, a constant, or Type.Field) in the package in dir, its lines
// joined by spaces.
func docComment(t *testing.T, dir, name string) string {
	t.Helper()
	typ, field, isField := strings.Cut(name, ".")
	for _, d := range declsOf(t, dir) {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name == name && d.Doc != nil {
				return strings.Join(strings.Fields(d.Doc.Text()), " ")
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.Name == name && s.Doc != nil {
							return strings.Join(strings.Fields(s.Doc.Text()), " ")
						}
					}
				case *ast.TypeSpec:
					st, ok := s.Type.(*ast.StructType)
					if !isField || s.Name.Name != typ || !ok {
						continue
					}
					for _, f := range st.Fields.List {
						for _, n := range f.Names {
							if n.Name == field && f.Doc != nil {
								return strings.Join(strings.Fields(f.Doc.Text()), " ")
							}
						}
					}
				}
			}
		}
	}
	t.Fatalf("no doc comment for %s in %s", name, dir)
	return ""
}

// The sentences of the docs that state a default or a limit state the
// code's value.
func TestDocsStatedValues(t *testing.T) {
	values := limitValues(t)
	for _, s := range []struct {
		where string // a Markdown file, or "doc:DIR:NAME", a doc comment
		re    string // one group: the value as written
		name  string // its value in limitValues
	}{
		{"docs/guide.md", "`WithPrefix\\(\"([^\"]*)\"\\)`", "fairlock.DefaultPrefix"},
		{"docs/guide.md", "`WithLeaseTTL\\((\\w+)\\)`", "fairlock.DefaultLeaseTTL"},
		{"docs/guide.md", "`WithWaiterTTL\\((\\w+)\\)`", "fairlock.DefaultWaiterTTL"},
		{"docs/guide.md", "\\(`WithWaiterTTL`, (\\d+ s) by\\s+default\\)", "fairlock.DefaultWaiterTTL"},
		{"docs/guide.md", "lease's TTL runs out\\s+\\((\\d+ s) by default\\)", "fairlock.DefaultLeaseTTL"},
		{"docs/guide.md", "At most (\\d+) semaphores per request", "fairlock.MaxResources"},
		{"docs/guide.md", "one over ([\\d,]+) bytes is refused", "election.MaxValueLen"},
		{"README.md", "dropped after one waiter TTL \\((\\d+ s) by default\\)", "fairlock.DefaultWaiterTTL"},
		{"doc:.:WithPrefix", `The default is "([^"]*)"`, "fairlock.DefaultPrefix"},
		{"doc:.:WithPrefix", `is at most (\d+) bytes`, "WithPrefix"},
		{"doc:.:WithOwner", `at most (\d+) printable`, "WithOwner"},
		{"doc:.:WithLeaseTTL", `The default is (\w+);`, "fairlock.DefaultLeaseTTL"},
		{"doc:.:WithLeaseTTL", `a TTL under (\w+) or`, "WithLeaseTTL`, `WithWaiterTTL"},
		{"doc:.:WithLeaseTTL", `over \[MaxTTL\] \((\w+)\)`, "fairlock.MaxTTL"},
		{"doc:.:WithWaiterTTL", `The default is (\w+);`, "fairlock.DefaultWaiterTTL"},
		{"doc:.:WithWaiterTTL", `a TTL under (\w+) or`, "WithLeaseTTL`, `WithWaiterTTL"},
		{"doc:.:WithWaiterTTL", `over \[MaxTTL\] \((\w+)\)`, "fairlock.MaxTTL"},
		{"doc:.:WithReplicaAck", `The timeout is at least (\w+)`, "WithReplicaAck"},
		{"doc:.:WithReplicaAck", `at most \[MaxTTL\] \((\w+)\)`, "fairlock.MaxTTL"},
		{"doc:.:WithMaxHold", `over \[MaxHoldLimit\] \((\d+ days)\)`, "fairlock.MaxHoldLimit"},
		{"doc:.:Request.MaxHold", `over \[MaxHoldLimit\] \((\d+ days)\)`, "fairlock.MaxHoldLimit"},
		{"doc:.:Request.LeaseTTL", `a TTL under (\w+) or`, "WithLeaseTTL`, `WithWaiterTTL"},
		{"doc:.:Request.LeaseTTL", `over \[MaxTTL\] \((\w+)\)`, "fairlock.MaxTTL"},
		{"doc:.:Request.LeaseTTL", `client's TTL \((\w+) by default\)`, "fairlock.DefaultLeaseTTL"},
		{"doc:semaphore:WithLeaseTTL", `a d under (\w+) or`, "WithLeaseTTL`, `WithWaiterTTL"},
		{"doc:semaphore:WithLeaseTTL", `over \[fairlock.MaxTTL\] \((\w+)\)`, "fairlock.MaxTTL"},
		{"doc:election:WithLeaseTTL", `a d under (\w+) or`, "WithLeaseTTL`, `WithWaiterTTL"},
		{"doc:election:WithLeaseTTL", `over \[fairlock.MaxTTL\] \((\w+)\)`, "fairlock.MaxTTL"},
		{"doc:.:MaxTTL", `accepted: (\w+)\.`, "fairlock.MaxTTL"},
		{"doc:.:MaxHoldLimit", `accepted: (\d+ days)`, "fairlock.MaxHoldLimit"},
		{"doc:.:Client.Abandon", `\(\[WithLeaseTTL\], (\d+ s) by default\)`, "fairlock.DefaultLeaseTTL"},
		{"doc:semaphore:WithMaxHold", `over \[fairlock.MaxHoldLimit\] \((\d+ days)\)`, "fairlock.MaxHoldLimit"},
	} {
		var text string
		if dir, name, ok := strings.Cut(strings.TrimPrefix(s.where, "doc:"), ":"); ok && strings.HasPrefix(s.where, "doc:") {
			if typ, m, ok := strings.Cut(name, "."); ok && typ == "Client" {
				text = methodDoc(t, dir, typ, m)
			} else {
				text = docComment(t, dir, name)
			}
		} else {
			src, err := os.ReadFile(s.where)
			if err != nil {
				t.Fatal(err)
			}
			text = string(src)
		}
		m := regexp.MustCompile(s.re).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("%s no longer states %s as /%s/: change the sentence and this test together", s.where, s.name, s.re)
			continue
		}
		want := values[s.name]
		got, err := docValue(m[1], want)
		if err != nil || got != want {
			t.Errorf("%s states %s as %q (%v, %v); the code has %v", s.where, s.name, m[1], got, err, want)
		}
	}
}

// methodDoc returns the doc comment of the method typ.name in dir.
func methodDoc(t *testing.T, dir, typ, name string) string {
	t.Helper()
	for _, d := range declsOf(t, dir) {
		if f, ok := d.(*ast.FuncDecl); ok && f.Recv != nil && f.Name.Name == name && f.Doc != nil {
			if strings.Contains(fmt.Sprint(f.Recv.List[0].Type), typ) {
				return strings.Join(strings.Fields(f.Doc.Text()), " ")
			}
		}
	}
	t.Fatalf("no doc comment for %s.%s in %s", typ, name, dir)
	return ""
}
