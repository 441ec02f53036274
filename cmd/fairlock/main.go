// Command fairlock runs a command under a fair, first-in first-out lock
// kept in Redis, and shows who holds and who waits for a lock (or a
// countdown latch's count, or a cyclic barrier's round).
//
//	fairlock run [flags] NAME -- COMMAND [ARGS...]
//	fairlock elect [flags] NAME -- COMMAND [ARGS...]
//	fairlock status [flags] NAME...
//	fairlock help [COMMAND]
//	fairlock version
//
// Run "fairlock --help" for the flags, exit statuses and examples.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// Exit statuses of fairlock itself. "run" otherwise exits with its
// command's status (128+N when the command was killed by signal N).
const (
	exitUsage     = 64  // bad flags or arguments
	exitError     = 70  // Redis did not answer, or another error of fairlock's
	exitNotGot    = 75  // the lock was busy (-n), or the wait ran out (-w) with Redis answering
	exitLeaseLost = 76  // the lease was lost while the command ran; it was signalled
	exitNoCommand = 127 // the command could not be started
)

// synopsis is the first part of the usage: how each command is called.
const synopsis = `usage:
  fairlock run [flags] NAME -- COMMAND [ARGS...]
  fairlock elect [flags] NAME -- COMMAND [ARGS...]
  fairlock status [flags] NAME...
  fairlock help [COMMAND]
  fairlock version
`

// about is what "fairlock --help" says between the synopsis and the flags.
const about = `
run waits its turn for NAME (first-in first-out across every process and
machine using the same Redis), runs COMMAND with FAIRLOCK_TOKEN set to the
lease's fencing token, keeps the lease alive while COMMAND runs, forwards
SIGINT, SIGTERM, SIGHUP and SIGQUIT to it, releases when it exits, and exits
with its status. It prints nothing but COMMAND's own output, and a line on
stderr when it gives up (-n, -w) or fails; -v says how long it waits, its
place in line, and when it got the lock.

COMMAND runs only while the lease is held, and so does every process it
starts. Without a terminal COMMAND gets a process group of its own, and
signals go to the whole group; in a terminal it stays in the shell's job,
so that it can read the terminal. If the lease is lost (or reaches
-max-hold), COMMAND gets SIGTERM so, and SIGKILL after -grace goes to every
process it started. What COMMAND leaves running when it exits gets SIGTERM,
then SIGKILL after -grace, before the lease is released. If fairlock itself
dies, even by SIGKILL, they all get SIGKILL at once. (So on Linux;
on macOS and the BSDs only COMMAND's process group is reached, and on
Windows, AIX, Solaris and illumos only COMMAND, which outlives a killed
fairlock.)

elect campaigns in the leader election NAME (candidates are served first-in
first-out) and runs COMMAND while this process leads, with FAIRLOCK_TOKEN set
to its term; like run, it forwards signals, exits with COMMAND's status, and
resigns when COMMAND exits, so the next candidate leads at once. If leadership
is lost, COMMAND gets SIGTERM, then SIGKILL after -grace, and elect exits 76.

status shows who holds NAME (owner, permits, token, held for, time left),
how many wait and for how long the oldest has, who waits (position, owner,
permits, waiting for), and, if NAME is an election, its leader. With
-kind latch it shows the countdown latch NAME (its count, the count it
started at, its waiters), with -kind barrier the cyclic barrier NAME (its
parties, its round, who has arrived, whether the round broke). An owner is
host:pid for fairlock's own processes (and a library client's WithOwner
label), else the start of its client id. With -watch it prints again at
that interval until interrupted; while Redis cannot be reached it says so
on stderr and keeps trying.

On a failure fairlock prints one line to stderr; -v also logs fairlock's
diagnostics there (lost leases, failing renewals, go-redis's connection
errors): one that repeats (Redis gone) once, then with a count of its
repeats every 10s or when something else is logged.

Redis is -redis ADDRESS, else $FAIRLOCK_REDIS_URL, else $REDIS_URL, else
127.0.0.1:6379. ADDRESS is HOST[:PORT] (port 6379 by default),
redis://[USER[:PASSWORD]@]HOST[:PORT][/DB], rediss://... for TLS, or
unix:///PATH[?db=DB] (or just /PATH) for a Unix socket. A Redis Cluster is
-cluster HOST:PORT[,HOST:PORT...] (any of its nodes; or a redis:// URL with
addr=HOST:PORT for more), a Sentinel set's master -sentinel HOST[:PORT][,...]
-master NAME (its sentinels, port 26379 by default).
`

// outro is what "fairlock --help" says after the flags.
const outro = `
A flag goes before NAME, as -flag VALUE, -flag=VALUE or --flag VALUE. A
DURATION is like 1m30s or 500ms, or a number of seconds (30, 2.5).

Exit statuses of run and elect, besides COMMAND's own:
  64  bad usage
  70  Redis did not answer (refused, timed out: the line names its address and
      what happened), or another error of fairlock's
  75  not acquired: NAME was busy (-n), or the wait ran out (-w) with Redis
      answering all along
  76  lease lost, or -max-hold reached, while COMMAND ran (COMMAND and what it
      started got SIGTERM, then SIGKILL after -grace)
  127 COMMAND could not be started
status exits 0, or 64 or 70.

Examples:
  fairlock run nightly-report -- ./report.sh            # one at a time, in arrival order
  fairlock run -capacity 4 encoders -- ffmpeg -i in.mp4 out.webm
  fairlock run -n deploy -- ./deploy.sh || echo "a deploy is running"
  fairlock run -w 30s -ttl 1m backup -- pg_dump mydb -f dump.sql
  fairlock run -v -redis redis.internal:6379 migrate -- ./migrate.sh   # says how long it waits
  fairlock run -max-hold 2h nightly-report -- ./report.sh   # a stuck report frees the lock after 2h
  fairlock elect -value "$(hostname):8080" scheduler -- ./scheduler
  fairlock status -json nightly-report encoders
  fairlock status -watch 1s encoders
  fairlock status -kind latch nightly-inputs      # a countdown latch: its count, its waiters
`

// A command is one of fairlock's commands, as its help shows it.
type command struct {
	name    string
	args    string // what follows the flags in its usage line
	summary string // what its -h says before the flags
	// own registers the command's own flags (not the common ones) on fs.
	own  func(fs *flag.FlagSet)
	main func(c *command, args []string, stdout, stderr io.Writer) int
}

var commands = []*command{
	{
		name: "run",
		args: "NAME -- COMMAND [ARGS...]",
		summary: `Waits its turn for NAME, runs COMMAND with FAIRLOCK_TOKEN set to the lease's
fencing token while it holds the lock (and no longer), releases it when
COMMAND exits, and exits with COMMAND's status.
`,
		own:  func(fs *flag.FlagSet) { new(runOptions).register(fs) },
		main: runCmd,
	},
	{
		name: "elect",
		args: "NAME -- COMMAND [ARGS...]",
		summary: `Campaigns in the leader election NAME (candidates are served first-in
first-out), runs COMMAND with FAIRLOCK_TOKEN set to its term while this
process leads (and no longer), resigns when COMMAND exits, and exits with
COMMAND's status.
`,
		own:  func(fs *flag.FlagSet) { new(electOptions).register(fs) },
		main: electCmd,
	},
	{
		name: "status",
		args: "NAME...",
		summary: `Shows who holds each NAME and who waits for it, in a table or as JSON, and
an election's leader.
`,
		own:  func(fs *flag.FlagSet) { new(statusOptions).register(fs) },
		main: statusCmd,
	},
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, synopsis+helpHint)
		return exitUsage
	}
	switch args[0] {
	case superviseCmdName:
		return superviseCmd(args[1:], stderr)
	case "-h", "-help", "--help", "help":
		if args[0] == "help" && len(args) > 1 {
			c := lookup(args[1])
			if c == nil {
				return unknownCommand(stderr, args[1])
			}
			c.help(stdout)
			return 0
		}
		help(stdout)
		return 0
	case "-version", "--version", "-V", "version":
		fmt.Fprintln(stdout, version())
		return 0
	}
	if c := lookup(args[0]); c != nil {
		return c.main(c, args[1:], stdout, stderr)
	}
	return unknownCommand(stderr, args[0])
}

const helpHint = `Run "fairlock --help" for the flags, exit statuses and examples.
`

// unknownCommand says that name is no command, with the usage, on stderr.
func unknownCommand(stderr io.Writer, name string) int {
	fmt.Fprintf(stderr, "fairlock: unknown command %q\n\n%s\n%s", name, synopsis, helpHint)
	return exitUsage
}

// help prints fairlock's whole help: every command and every flag.
func help(w io.Writer) {
	fmt.Fprint(w, synopsis, about, "\nFlags of every command:\n")
	fs := flag.NewFlagSet("fairlock", flag.ContinueOnError)
	new(common).register(fs)
	printFlags(w, fs)
	for _, c := range commands {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.own(fs)
		fmt.Fprintf(w, "\nFlags of %s:\n", c.name)
		printFlags(w, fs)
	}
	fmt.Fprint(w, outro)
}

// help prints the command's usage and every flag it takes.
func (c *command) help(w io.Writer) {
	fmt.Fprintf(w, "usage: fairlock %s [flags] %s\n\n%s\nFlags:\n", c.name, c.args, c.summary)
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	new(common).register(fs)
	c.own(fs)
	printFlags(w, fs)
	fmt.Fprint(w, "\nA DURATION is like 1m30s or 500ms, or a number of seconds (30, 2.5).\n"+
		"Run \"fairlock --help\" for every command, exit statuses and examples.\n")
}

// usageError prints the command's usage line on stderr, after the line
// that said what was wrong, and returns exitUsage.
func (c *command) usageError(stderr io.Writer) int {
	fmt.Fprintf(stderr, "usage: fairlock %s [flags] %s\nRun \"fairlock %s -h\" for its flags.\n", c.name, c.args, c.name)
	return exitUsage
}

// printFlags prints fs's flags as Go's tools do, with the value's name in
// capitals: "  -w DURATION" and, on the next line, what it does.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, use := flag.UnquoteUsage(f)
		switch _, dur := f.Value.(*durationValue); {
		case dur:
			name = "DURATION"
		case name == "int":
			name = "N"
		case f.Name == "redis":
			name = "ADDRESS"
		case f.Name == "cluster":
			name = "NODES"
		case f.Name == "sentinel":
			name = "SENTINELS"
		case f.Name == "master":
			name = "NAME"
		}
		line := "  -" + f.Name
		if name != "" {
			line += " " + strings.ToUpper(name)
		}
		fmt.Fprintf(w, "%s\n        %s", line, strings.ReplaceAll(use, "\n", "\n        "))
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
			if g, ok := f.Value.(flag.Getter); ok && isString(g.Get()) {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w)
	})
}

func isString(v any) bool {
	_, ok := v.(string)
	return ok
}

// version is fairlock's version line: the module's version, or "(devel)"
// and the VCS revision for a build from a checkout, and the Go version.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "fairlock (unknown version)"
	}
	return versionOf(bi)
}

// pseudoVersion matches a Go module pseudo-version: the version the go
// command gives a commit that no tag names (vX.Y.Z-[pre.0.]yyyymmddhhmmss-commit).
var pseudoVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+-(.*\.)?(0\.)?[0-9]{14}-[0-9a-f]{12}(\+.*)?$`)

// versionOf is the version line of the binary bi describes: the module
// version it was installed at, or for a build from a checkout (whose
// module version is "(devel)" or a pseudo-version) the release the source
// says it is (fairlock.Version) and the build's own version after it.
func versionOf(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	if v == "(devel)" || pseudoVersion.MatchString(v) {
		v = fairlock.Version + " " + v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case "vcs.modified":
			modified = s.Value
		}
	}
	line := "fairlock " + v
	if rev != "" && !strings.Contains(v, rev) {
		line += " " + rev
		if modified == "true" {
			line += "+dirty"
		}
	}
	return line + " " + bi.GoVersion
}

// common holds the flags every command takes.
type common struct {
	url      string
	cluster  string // -cluster: a Redis Cluster's nodes
	sentinel string // -sentinel: a Sentinel set's sentinels
	master   string // -master: the master's name in the Sentinel set
	prefix   string
	verbose  bool
	stderr   io.Writer
	health   *redisHealth  // set by connect
	quiet    *quietHandler // -v's handler, once logger made it
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "redis", "", "where Redis is: HOST[:PORT], redis://[USER[:PASSWORD]@]HOST[:PORT][/DB],\n"+
		"rediss://... (TLS) or unix:///PATH (default: $FAIRLOCK_REDIS_URL,\nelse $REDIS_URL, else 127.0.0.1:6379)")
	fs.StringVar(&c.cluster, "cluster", "", "a Redis Cluster instead: HOST:PORT[,HOST:PORT...] of any of its nodes, or\nredis://[USER[:PASSWORD]@]HOST:PORT[?addr=HOST:PORT...]")
	fs.StringVar(&c.sentinel, "sentinel", "", "a Sentinel set's master instead: HOST[:PORT][,HOST[:PORT]...] of its\nsentinels (port 26379 by default), with -master; or\nredis://[USER[:PASSWORD]@]HOST:PORT?master_name=NAME[&addr=HOST:PORT...]")
	fs.StringVar(&c.master, "master", "", "with -sentinel: the name the sentinels know the master by")
	fs.StringVar(&c.prefix, "prefix", fairlock.DefaultPrefix, "key prefix shared by every user of the lock")
	fs.BoolVar(&c.verbose, "v", false, "log fairlock's diagnostics (and go-redis's) to stderr; run and elect also say\nhow long they wait, their place in line, and when they get NAME")
}

// parse parses the command's flags from args into fs, on which the common
// flags and the command's own are registered. With -h it prints the
// command's help and returns 0 and false; on a bad flag it prints what is
// wrong and the usage on stderr and returns exitUsage and false.
func (c *command) parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (int, bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		c.help(stdout)
		return 0, false
	}
	return c.usageError(stderr), false
}

// newFlagSet returns a flag set for the command c that prints a bad flag's
// error on stderr and leaves the usage to c.parse.
func newFlagSet(c *command, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("fairlock "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return fs
}

// nonNegative reports, on stderr, a negative duration given to the flag
// name of the command c; it returns false for one.
func nonNegative(c *command, stderr io.Writer, name string, d time.Duration) bool {
	if d < 0 {
		fmt.Fprintf(stderr, "fairlock %s: -%s %v is negative\n", c.name, name, d)
		return false
	}
	return true
}

// atMost reports, on stderr, a duration over limit given to the flag name
// of the command c; it returns false for one.
func atMost(c *command, stderr io.Writer, name string, d, limit time.Duration) bool {
	if d > limit {
		fmt.Fprintf(stderr, "fairlock %s: -%s %v is longer than the largest accepted, %v\n", c.name, name, d, limit)
		return false
	}
	return true
}

// redisLog receives go-redis's internal logs (pool dial failures and the
// like): dropped, or with -v logged at Debug. Without it go-redis prints
// them to stderr, once per retry, besides fairlock's own one line.
type redisLog struct{ l *slog.Logger }

func (r redisLog) Printf(ctx context.Context, format string, v ...any) {
	if r.l != nil {
		r.l.Log(ctx, slog.LevelDebug, strings.TrimSpace(fmt.Sprintf(format, v...)), slog.String("source", "go-redis"))
	}
}

// logger returns the -v logger, or nil. It logs a diagnostic that keeps
// coming once, then with a count at most every logSummaryEvery (see
// quietHandler); flushLog logs what it holds back.
func (c *common) logger() *slog.Logger {
	if !c.verbose {
		return nil
	}
	if c.quiet == nil {
		c.quiet = newQuietHandler(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}), logSummaryEvery)
	}
	return slog.New(c.quiet)
}

// flushLog logs the diagnostics -v's logger holds back, as the command
// exits.
func (c *common) flushLog() {
	if c.quiet != nil {
		c.quiet.flush()
	}
}

// errLine renders err as fairlock's one line about it: "fairlock: " once,
// though the error's layers each start with it.
func errLine(err error) string {
	return "fairlock: " + strings.ReplaceAll(err.Error(), "fairlock: ", "")
}

// processLabel is how this process shows in status: host:pid, the host
// name cut to 40 bytes and with the characters an owner label may not
// hold made '_'. It is fairlock's owner label (fairlock.WithOwner) and
// elect's default -value.
func processLabel() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f || strings.ContainsRune("{}/", r) {
			return '_'
		}
		return r
	}, host)
	return fmt.Sprintf("%.40s:%d", host, os.Getpid())
}

// connect opens Redis (see dial) and a fairlock client labelled with
// processLabel. A bad address fails with an error matching errBadAddress.
func (c *common) connect(opts ...fairlock.Option) (redisConn, *fairlock.Client, error) {
	rdb, where, err := c.dial()
	if err != nil {
		return nil, nil, err
	}
	log := c.logger()
	redis.SetLogger(redisLog{log})
	if log != nil {
		opts = append(opts, fairlock.WithLogger(log))
	}
	c.health = newRedisHealth(where)
	rdb.AddHook(c.health)
	fc, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(c.prefix), fairlock.WithOwner(processLabel())}, opts...)...)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return rdb, fc, nil
}

// closeWithin closes fc, waiting at most d for it: fc.Close waits for the
// clean-up that calls left running (a withdrawal, a release sent again),
// which against a Redis that does not answer lasts up to a waiter TTL
// plus go-redis's read timeout. fairlock is about to exit, after which
// Redis drops what was not cleaned up at its deadline.
func closeWithin(fc *fairlock.Client, d time.Duration) {
	done := make(chan struct{})
	go func() {
		fc.Close()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
