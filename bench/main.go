// Command bench measures fairlock side by side with redsync, redislock and a
// hand-written SET NX lock, in one run, and prints the ratios that matter:
// latency against a PING round trip, handoff against an idle PING,
// throughput and fairness under contention, order of grants, a thousand
// waiters draining, and what each costs Redis (CPU, commands, memory,
// connections) at scale.
//
// Usage:
//
//	go run .                       # embedded miniredis: functional figures only
//	go run . -redis auto           # a redis-server from PATH on a free loopback port
//	                               # (or from $FAIRLOCK_REDIS_SERVER_DIR when set)
//	go run . -redis 127.0.0.1:6380 # an existing server (keys under "bench:<run>:")
//
// Flags -scenarios and -duration choose what runs and for how long; -json
// FILE writes the figures for machines; -svg DIR draws them as SVG files
// in DIR and links them under the tables. Tables go to stdout, one
// progress line per scenario to stderr.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	opStats.print()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type config struct {
	redis     string
	scenarios []string
	duration  time.Duration
	jsonFile  string
	only      []string      // implementations
	maxQueue  int           // the queue scenario's largest queue
	drainStop time.Duration // how long the drain scenario waits for its waiters; 0 for its default
	svgDir    string        // where the figures go; "" for none
	cpuProf   string        // where a CPU profile of the whole run goes; "" for none
	slowlog   bool          // time each call inside Redis (SLOWLOG), per scenario
}

var allScenarios = []string{"uncontended", "handoff", "contended", "contended-100us", "fifo", "drain", "semaphore", "dining", "phase", "queue", "floor", "scale", "wake"}

func parse(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var scen, only string
	fs.StringVar(&cfg.redis, "redis", "", `Redis to measure: "" for the embedded miniredis, "auto" to start redis-server from $FAIRLOCK_REDIS_SERVER_DIR or PATH, or host:port`)
	fs.StringVar(&scen, "scenarios", "all", "comma-separated scenarios: "+strings.Join(allScenarios, ", ")+", or all")
	fs.DurationVar(&cfg.duration, "duration", time.Second, "time each implementation gets in each measurement")
	fs.DurationVar(&cfg.drainStop, "drain-stop", 0, "how long after the release the drain scenario waits for its waiters: 0 for the longer of 1s and 3 × -duration")
	fs.StringVar(&cfg.jsonFile, "json", "", "also write the results as JSON to this file")
	fs.StringVar(&cfg.svgDir, "svg", "", "also draw the results as SVG figures into this directory (created if need be), and link them from the tables; relative to the directory the command runs in (bench/ under go -C bench)")
	fs.StringVar(&only, "impls", "all", "comma-separated implementations: fairlock, redsync, redislock, setnx, ..., or all (all but the studies, such as "+autopipeName+", measured only when named)")
	fs.StringVar(&cfg.cpuProf, "cpuprofile", "", "also write a CPU profile of the whole run (every implementation in this process) to this file; in the contended scenarios the samples of each implementation's goroutines carry the labels impl and N (go tool pprof -tagfocus impl=^fairlock$)")
	fs.BoolVar(&cfg.slowlog, "slowlog", false, "also time each call inside Redis, per scenario, from SLOWLOG with every command logged: a table of server time per call (a script's with the commands it runs), which costs the server about a microsecond a command (real servers only)")
	fs.IntVar(&cfg.maxQueue, "max-queue", 0, "the queue scenario's largest queue: sizes 10, 100, ... 100000 up to this one; 0 for 10000 on a real server, 1000 on the embedded miniredis")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.duration <= 0 {
		return cfg, fmt.Errorf("-duration must be positive")
	}
	if cfg.drainStop < 0 {
		return cfg, fmt.Errorf("-drain-stop must not be negative")
	}
	if cfg.maxQueue == 0 {
		cfg.maxQueue = 10000
		if cfg.redis == "" {
			cfg.maxQueue = 1000 // miniredis queues 10,000 in about 35 s
		}
	}
	if cfg.maxQueue < queueSizes[0] {
		return cfg, fmt.Errorf("-max-queue must be at least %d", queueSizes[0])
	}
	cfg.scenarios = allScenarios
	if scen != "all" {
		cfg.scenarios = nil
		for _, s := range strings.Split(scen, ",") {
			if !slices.Contains(allScenarios, s) {
				return cfg, fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(allScenarios, ", "))
			}
			cfg.scenarios = append(cfg.scenarios, s)
		}
	}
	if only != "all" {
		names := []string{}
		for _, im := range impls() {
			names = append(names, im.name)
		}
		for _, s := range strings.Split(only, ",") {
			if !slices.Contains(names, s) {
				return cfg, fmt.Errorf("unknown implementation %q (have %s)", s, strings.Join(names, ", "))
			}
			cfg.only = append(cfg.only, s)
		}
	}
	return cfg, nil
}

// env is the Redis under test and the run's bookkeeping.
type env struct {
	cfg     config
	addr    string
	backend string // "miniredis", "redis-server (started)", "redis-server at ADDR"
	// serverPath is the redis-server program -redis auto ran; "" otherwise.
	serverPath string
	real       bool
	admin      *redis.Client // for INFO; not counted
	run        string        // key prefix of this run
	impls      []impl
	skipped    []string // implementations this server cannot run
	stderr     io.Writer
}

// Report is what a run measured.
type Report struct {
	Meta      map[string]string `json:"meta"`
	Scenarios []*Table          `json:"scenarios"`
	Targets   []Target          `json:"targets"`
}

// Table is one scenario's results.
type Table struct {
	Name    string           `json:"name"`
	Title   string           `json:"title"`
	Note    string           `json:"note,omitempty"`
	Columns []string         `json:"columns"`
	Rows    [][]string       `json:"rows"`
	Data    []map[string]any `json:"data"`
	// figs are drawn into -svg's directory and linked under the table.
	figs []*figure
}

// Target is one of the benchmark's targets and whether this run met it.
// A timing target (a latency, a throughput, Redis CPU) is judged only on
// a real server: miniredis's speed says nothing of Redis's.
type Target struct {
	Scenario string `json:"scenario"`
	What     string `json:"what"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
	Timing   bool   `json:"timing,omitempty"`
}

// timed marks t a timing target.
func timed(t Target) Target {
	t.Timing = true
	return t
}

func run(args []string, stdout, stderr io.Writer) error {
	cfg, err := parse(args, stderr)
	if err != nil {
		return err
	}
	redis.SetLogger(quietLogger{})
	if cfg.cpuProf != "" {
		f, err := os.Create(cfg.cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	e := &env{cfg: cfg, stderr: stderr, run: "bench:" + rand.Text()[:8] + ":"}
	stop, err := e.start()
	if err != nil {
		return err
	}
	defer stop()
	if info, err := e.admin.Info(context.Background(), "server").Result(); err == nil {
		serverVersion = infoField(info, "redis_version")
	}
	for _, im := range impls() {
		asked := slices.Contains(cfg.only, im.name)
		if (len(cfg.only) > 0 || im.optIn) && !asked {
			continue
		}
		if im.realOnly && !e.real {
			if asked {
				return fmt.Errorf("%s runs on a real server only (-redis auto or host:port)", im.name)
			}
			e.skipped = append(e.skipped, im.name)
			continue
		}
		e.impls = append(e.impls, im)
	}

	rep := &Report{Meta: e.meta()}
	// The clock watch has a connection of its own, open before any
	// scenario counts connections, and reads Redis's clock every 5 s: its
	// TIME commands add under 0.01 to any per-operation count of server
	// commands (INFO commandstats counts them with the scripts' own).
	watchRDB := redis.NewClient(&redis.Options{Addr: e.addr, PoolSize: 1})
	defer watchRDB.Close()
	if err := watchRDB.Ping(context.Background()).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", e.addr, err)
	}
	clock := watchClock(watchRDB, 5*time.Second)
	reported := false
	defer func() {
		if s := clock.end(); s != "" && !reported {
			fmt.Fprintf(stderr, "bench: %s\n", s)
		}
	}()
	for _, name := range cfg.scenarios {
		fmt.Fprintf(stderr, "bench: %s ...\n", name)
		start := time.Now()
		tables, targets, err := e.withSteps(name, scenarios[name])
		if err != nil {
			if s := clock.report(); s != "" {
				reported = true
				return fmt.Errorf("scenario %s: %w (%s)", name, err, s)
			}
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		rep.Scenarios = append(rep.Scenarios, tables...)
		rep.Targets = append(rep.Targets, targets...)
		fmt.Fprintf(stderr, "bench: %s done in %v\n", name, time.Since(start).Round(time.Millisecond))
	}
	if sum := summary(rep); len(sum.Rows) > 0 {
		rep.Scenarios = append([]*Table{sum}, rep.Scenarios...)
	}
	if cfg.svgDir != "" {
		if err := writeFigures(cfg.svgDir, rep); err != nil {
			return err
		}
	}
	writeMarkdown(stdout, rep, e)
	if cfg.jsonFile != "" {
		jsonSafe(rep)
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.jsonFile, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// jsonSafe replaces the figures JSON cannot hold (NaN and infinities: a
// measurement that could not be made, such as Redis CPU on a server that
// gives none, or a ratio to zero) with null.
func jsonSafe(rep *Report) {
	for _, t := range rep.Scenarios {
		for _, d := range t.Data {
			for k, v := range d {
				if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
					d[k] = nil
				}
			}
		}
	}
}

// start connects to (or starts) the Redis to measure.
func (e *env) start() (func(), error) {
	var stop func()
	switch e.cfg.redis {
	case "":
		m, err := miniredis.Run()
		if err != nil {
			return nil, err
		}
		e.addr, e.backend = m.Addr(), "miniredis (embedded; figures are functional only, not speed)"
		stop = m.Close
	case "auto":
		s, err := redisserver.Start()
		if err != nil {
			return nil, fmt.Errorf("-redis auto: %w", err)
		}
		e.addr, e.backend, e.real = s.Addr, "redis-server started on "+s.Addr, true
		e.serverPath, _ = redisserver.Binary("redis-server")
		stop = s.Stop
	default:
		e.addr, e.backend, e.real = e.cfg.redis, "redis-server at "+e.cfg.redis, true
		stop = func() {}
	}
	e.admin = redis.NewClient(&redis.Options{Addr: e.addr})
	if err := e.admin.Ping(context.Background()).Err(); err != nil {
		stop()
		return nil, fmt.Errorf("redis at %s: %w", e.addr, err)
	}
	return func() { e.cleanup(); e.admin.Close(); stop() }, nil
}

// cleanup deletes the run's keys from a server the harness did not start.
func (e *env) cleanup() {
	ctx := context.Background()
	iter := e.admin.Scan(ctx, 0, e.run+"*", 1000).Iterator()
	for iter.Next(ctx) {
		e.admin.Del(ctx, iter.Val())
	}
}

func (e *env) meta() map[string]string {
	m := map[string]string{
		"date":     time.Now().UTC().Format("2006-01-02 15:04 MST"),
		"backend":  e.backend,
		"go":       runtime.Version(),
		"os/arch":  runtime.GOOS + "/" + runtime.GOARCH,
		"cpus":     fmt.Sprint(runtime.NumCPU()),
		"cpu":      cpuModel(),
		"duration": e.cfg.duration.String(),
		// The run's id: the README's figures name the run they come from.
		"run id": strings.TrimSuffix(strings.TrimPrefix(e.run, "bench:"), ":"),
	}
	if len(e.skipped) > 0 {
		m["not run here"] = strings.Join(e.skipped, ", ") + " (they need client-side caching, which the embedded miniredis lacks: run with -redis auto)"
	}
	if info, err := e.admin.Info(context.Background(), "server").Result(); err == nil {
		if v := infoField(info, "redis_version"); v != "" {
			m["redis_version"] = v
		}
		// Valkey's redis_version is the Redis release it matches; the
		// server line names the server itself.
		if b, ok := redisserver.FromInfo(info); ok && e.real {
			b.Path = e.serverPath
			m["server"] = b.String()
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/go-redsync/redsync/v4", "github.com/bsm/redislock", "github.com/redis/go-redis/v9", "github.com/alicebob/miniredis/v2",
				"github.com/redis/rueidis", "github.com/valkey-io/valkey-go":
				m[d.Path] = d.Version
			case "github.com/fairlock/fairlock":
				m[d.Path] = "this checkout"
			}
		}
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// infoField reads one "field:value" line of an INFO reply.
func infoField(info, field string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v
		}
	}
	return ""
}

func writeMarkdown(w io.Writer, rep *Report, e *env) {
	fmt.Fprintf(w, "# fairlock bench\n\n")
	if !e.real {
		fmt.Fprintf(w, "**This run is on the embedded miniredis: it checks behaviour (order, fairness, "+
			"capacity, no overlap), not speed.** Timing targets (latencies, throughput, Redis CPU) are "+
			"judged on a real server only, and are marked \"not judged\" below. For real figures, "+
			"`go -C bench run . -redis auto` starts a redis-server from PATH "+
			"(Debian or Ubuntu: `apt-get install redis-server`), or `-redis HOST:PORT` uses yours.\n\n")
	}
	if s := rep.Meta["server"]; s != "" {
		fmt.Fprintf(w, "Server: %s\n\n", s)
	}
	keys := make([]string, 0, len(rep.Meta))
	for k := range rep.Meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "- %s: %s\n", k, rep.Meta[k])
	}
	fmt.Fprintln(w, "\nImplementations:")
	for _, im := range e.impls {
		fmt.Fprintf(w, "- %s: %s\n", im.name, im.about)
	}
	for _, t := range rep.Scenarios {
		fmt.Fprintf(w, "\n## %s\n\n", t.Title)
		if t.Note != "" {
			fmt.Fprintf(w, "%s\n\n", t.Note)
		}
		if len(t.Rows) == 0 {
			continue // nothing measured; the note says why
		}
		fmt.Fprintf(w, "| %s |\n|", strings.Join(t.Columns, " | "))
		for range t.Columns {
			fmt.Fprint(w, "---|")
		}
		fmt.Fprintln(w)
		for _, r := range t.Rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
		}
		if e.cfg.svgDir != "" {
			for _, fg := range t.figs {
				fmt.Fprintf(w, "\n![%s](%s)\n", fg.title, path.Join(filepath.ToSlash(e.cfg.svgDir), fg.name+".svg"))
			}
		}
	}
	if len(rep.Targets) > 0 {
		fmt.Fprintf(w, "\n## Targets\n\n")
		if !e.real {
			fmt.Fprintf(w, "Measured on miniredis: timing targets are not judged (run with -redis auto).\n\n")
		}
		fmt.Fprintln(w, "| scenario | target | measured | met |\n|---|---|---|---|")
		for _, t := range rep.Targets {
			met := "yes"
			switch {
			case t.Timing && !e.real:
				met = "not judged (miniredis)"
			case !t.Met:
				met = "**no**"
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.Scenario, t.What, t.Measured, met)
		}
	}
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
