package fairlock

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// scriptCalls are the go-redis methods that run or load a script or a
// function: only the engine (the root package) may call them.
var scriptCalls = map[string]bool{
	"NewScript": true, "Eval": true, "EvalSha": true, "EvalRO": true, "EvalShaRO": true,
	"FCall": true, "FCallRO": true, "FunctionLoad": true, "FunctionLoadReplace": true, "ScriptLoad": true,
}

// No package outside the engine runs a Redis script of its own: the
// packages built on it (semaphore, multilock, election, the command line,
// fairlockotel, and any later one) reach Redis's scripts through the
// engine's ops, which keep its promises (deadlines, flags, replica acks,
// resends, the function library, another program's key named). Test
// files may use scripts to set up what they test.
func TestNoScriptsOutsideEngine(t *testing.T) {
	for dir := range backendModules {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
			t.Errorf("backend module %s: %v", dir, err)
		}
	}
	fset := token.NewFileSet()
	found := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// bench/ is a module of its own, with the peers' locks; the
			// Backends of other Redis clients are the script path the
			// engine calls (see backend.Backend).
			// internal/differential's scripts read and expire the
			// differential test's replay databases, never a client's.
			if path == "bench" || backendModules[path] || path == "internal/differential" ||
				(path != "." && strings.HasPrefix(d.Name(), ".")) || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Dir(path) == "." || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		found++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
				if scriptCalls[sel.Sel.Name] {
					t.Errorf("%s: calls %s: a script outside the engine", fset.Position(call.Pos()), sel.Sel.Name)
				}
				if sel.Sel.Name == "Do" {
					for _, a := range call.Args {
						if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							if s, _ := strconv.Unquote(lit.Value); scriptCalls[canonical(s)] {
								t.Errorf("%s: sends %s: a script outside the engine", fset.Position(call.Pos()), s)
							}
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 10 {
		t.Fatalf("read %d files outside the root package; the walk is broken", found)
	}
}

// backendModules are the modules that wrap another Redis client as a
// backend.Backend: the engine sends its scripts through them.
var backendModules = map[string]bool{"fairlockrueidis": true, "fairlockvalkey": true}

// canonical maps a command name sent with Do ("evalsha", "FCALL") to the
// method name scriptCalls holds.
func canonical(cmd string) string {
	switch strings.ToUpper(cmd) {
	case "EVAL":
		return "Eval"
	case "EVALSHA":
		return "EvalSha"
	case "EVAL_RO":
		return "EvalRO"
	case "EVALSHA_RO":
		return "EvalShaRO"
	case "FCALL":
		return "FCall"
	case "FCALL_RO":
		return "FCallRO"
	case "FUNCTION", "SCRIPT":
		return "FunctionLoad"
	}
	return ""
}

// Every runnable example uses only public packages, so that a reader on
// pkg.go.dev can copy it: no file with an Example function imports one of
// this module's internal packages.
func TestExamplesUsePublicPackages(t *testing.T) {
	fset := token.NewFileSet()
	examples := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		full, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		has := false
		for _, d := range full.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
				has = true
			}
		}
		if !has {
			return nil
		}
		examples++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				t.Errorf("%s: an example file imports %s: a reader cannot copy it", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if examples < 4 {
		t.Fatalf("found %d files with examples; the walk is broken", examples)
	}
}

// goRedisFiles are the root package's files that talk to go-redis: its
// Backend (goredis.go, with New and RedisClient), the dial watch that
// reports a Redis it cannot reach at once (prompt.go), and the refusal of
// a Ring (ring.go). Everything else in the engine speaks to Redis through
// a Backend and reads fairlock's own values and errors (a result, a
// ReplyError): this list only shrinks.
var goRedisFiles = map[string]bool{"goredis.go": true, "prompt.go": true, "ring.go": true}

// No file of the root package beyond goRedisFiles imports go-redis, and
// each of those still does (a file freed of it leaves the list).
func TestGoRedisStaysAtTheEdge(t *testing.T) {
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	imports := map[string]bool{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/redis/go-redis/") {
				imports[path] = true
			}
		}
		if imports[path] && !goRedisFiles[path] {
			t.Errorf("%s imports go-redis: the engine above the script call reads fairlock's values and errors only (see goredis.go)", path)
		}
	}
	for path := range goRedisFiles {
		if !imports[path] {
			t.Errorf("%s no longer imports go-redis: take it off goRedisFiles", path)
		}
	}
}

// redisClientLibs are the Go Redis client libraries a Backend wraps.
var redisClientLibs = []string{
	"github.com/redis/go-redis/", "github.com/redis/rueidis", "github.com/valkey-io/valkey-go",
	"github.com/gomodule/redigo", "github.com/mediocregopher/radix",
}

// mayImportClients are the places of the repository that may import a
// Redis client library: the Backends (go-redis's in the root package's
// goRedisFiles, with internal/testhook, which builds its test options,
// go-redis hooks on its blocking client among them; the rueidis and
// valkey-go modules), the programs (they choose their client), and the
// test harness. The library's packages (the root's other files,
// semaphore, multilock, election, fairlockotel, internal/engine) reach
// Redis through a Backend only.
var mayImportClients = []string{
	"fairlockrueidis/", "fairlockvalkey/", "internal/testhook/",
	"cmd/", "examples/", "bench/",
	"internal/clients/", "internal/conformance/", "internal/differential/", "internal/faulttest/", "internal/fltest/", "internal/halfrun/",
	"internal/redisserver/", "internal/redistest/", "internal/robustness/", "internal/statecheck/",
}

// No file of the repository outside mayImportClients (and goRedisFiles)
// imports a Redis client library; the walk also finds that the library's
// packages are there to check.
func TestRedisClientsOnlyInBackends(t *testing.T) {
	fset := token.NewFileSet()
	checked := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || goRedisFiles[path] {
			return nil
		}
		for _, p := range mayImportClients {
			if strings.HasPrefix(path, p) {
				return nil
			}
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked[filepath.Dir(path)] = true
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, lib := range redisClientLibs {
				if strings.HasPrefix(p, lib) {
					t.Errorf("%s imports %s: outside a Backend, the library speaks to Redis through backend.Backend", path, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{".", "semaphore", "multilock", "election", "fairlockotel", "internal/engine"} {
		if !checked[dir] {
			t.Errorf("%s was not checked: the walk is broken", dir)
		}
	}
}
