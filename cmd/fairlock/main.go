// Command fairlock runs a command under a fair, first-in first-out lock
// kept in Redis, and shows who holds and who waits for a lock.
//
//	fairlock run [flags] NAME -- COMMAND [ARGS...]
//	fairlock elect [flags] NAME -- COMMAND [ARGS...]
//	fairlock status [flags] NAME...
//
// Run "fairlock -h" for the flags, exit statuses and examples.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// Exit statuses of fairlock itself. "run" otherwise exits with its
// command's status (128+N when the command was killed by signal N).
const (
	exitUsage     = 64  // bad flags or arguments
	exitError     = 70  // Redis unreachable or another error of fairlock's
	exitNotGot    = 75  // the lock was busy (-n) or the wait timed out (-w)
	exitLeaseLost = 76  // the lease was lost while the command ran; it was signalled
	exitNoCommand = 127 // the command could not be started
)

const usage = `usage:
  fairlock run [flags] NAME -- COMMAND [ARGS...]
  fairlock elect [flags] NAME -- COMMAND [ARGS...]
  fairlock status [flags] NAME...

run waits its turn for NAME (first-in first-out across every process and
machine using the same Redis), runs COMMAND with FAIRLOCK_TOKEN set to the
lease's fencing token, keeps the lease alive while COMMAND runs, forwards
SIGINT, SIGTERM, SIGHUP and SIGQUIT to it, releases when it exits, and exits
with its status. It prints nothing but COMMAND's own output.

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
permits, waiting since), and, if NAME is an election, its leader. With
-watch it prints again at that interval until interrupted; while Redis
cannot be reached it says so on stderr and keeps trying.

On a failure fairlock prints one line to stderr; -v also logs fairlock's
diagnostics there (lost leases, failing renewals, go-redis's connection
errors).

Redis is -redis URL, else $FAIRLOCK_REDIS_URL, else $REDIS_URL, else
redis://127.0.0.1:6379 (rediss:// for TLS; redis://user:password@host for ACL).

Exit statuses of run and elect, besides COMMAND's own:
  64  bad usage            70  Redis or other error     75  not acquired (-n busy, -w timed out)
  76  lease lost, or -max-hold reached, while COMMAND ran (COMMAND and what it
      started got SIGTERM, then SIGKILL after -grace)
  127 COMMAND could not be started

Examples:
  fairlock run nightly-report -- ./report.sh            # one at a time, in arrival order
  fairlock run -capacity 4 encoders -- ffmpeg -i in.mp4 out.webm
  fairlock run -n deploy -- ./deploy.sh || echo "a deploy is running"
  fairlock run -w 30s -ttl 1m backup -- pg_dump mydb -f dump.sql
  fairlock run -max-hold 2h nightly-report -- ./report.sh   # a stuck report frees the lock after 2h
  fairlock elect -value "$(hostname):8080" scheduler -- ./scheduler
  fairlock status -json nightly-report encoders
  fairlock status -watch 1s encoders
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stderr)
	case "elect":
		return electCmd(args[1:], stderr)
	case "status":
		return statusCmd(args[1:], stdout, stderr)
	case superviseCmdName:
		return superviseCmd(args[1:], stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "fairlock: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// common holds the flags both commands take.
type common struct {
	url     string
	prefix  string
	verbose bool
	stderr  io.Writer
}

func (c *common) register(fs *flag.FlagSet, stderr io.Writer) {
	c.stderr = stderr
	fs.StringVar(&c.url, "redis", "", "Redis URL (default $FAIRLOCK_REDIS_URL, $REDIS_URL, redis://127.0.0.1:6379)")
	fs.StringVar(&c.prefix, "prefix", fairlock.DefaultPrefix, "key prefix shared by every user of the lock")
	fs.BoolVar(&c.verbose, "v", false, "log fairlock's diagnostics (and go-redis's) to stderr")
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

// logger returns the -v logger, or nil.
func (c *common) logger() *slog.Logger {
	if !c.verbose {
		return nil
	}
	return slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// errLine renders err as fairlock's one line about it: "fairlock: " once,
// though the error's layers each start with it.
func errLine(err error) string {
	return "fairlock: " + strings.ReplaceAll(err.Error(), "fairlock: ", "")
}

// connect opens Redis and a fairlock client labelled with this host and pid.
func (c *common) connect(opts ...fairlock.Option) (*redis.Client, *fairlock.Client, error) {
	url := c.url
	for _, env := range []string{"FAIRLOCK_REDIS_URL", "REDIS_URL"} {
		if url == "" {
			url = os.Getenv(env)
		}
	}
	if url == "" {
		url = "redis://127.0.0.1:6379"
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("bad Redis URL: %w", err)
	}
	log := c.logger()
	redis.SetLogger(redisLog{log})
	if log != nil {
		opts = append(opts, fairlock.WithLogger(log))
	}
	rdb := redis.NewClient(o)
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || strings.ContainsRune("{}/", r) {
			return '_'
		}
		return r
	}, host)
	label := fmt.Sprintf("%.40s:%d", host, os.Getpid())
	fc, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(c.prefix), fairlock.WithOwner(label)}, opts...)...)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return rdb, fc, nil
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("fairlock "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage+"\nflags of "+name+":\n")
		fs.PrintDefaults()
	}
	return fs
}
