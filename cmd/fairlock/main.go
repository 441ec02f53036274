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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
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

elect campaigns in the leader election NAME (candidates are served first-in
first-out) and runs COMMAND while this process leads, with FAIRLOCK_TOKEN set
to its term; like run, it forwards signals, exits with COMMAND's status, and
resigns when COMMAND exits, so the next candidate leads at once. If leadership
is lost, COMMAND gets SIGTERM, then SIGKILL after -grace, and elect exits 76.

status shows who holds NAME (owner, permits, token, held for, time left),
how many wait and for how long the oldest has, who waits (position, owner,
permits, waiting since), and, if NAME is an election, its leader.

On a failure fairlock prints one line to stderr; -v also logs fairlock's
diagnostics there (lost leases, failing renewals, go-redis's connection
errors).

Redis is -redis URL, else $FAIRLOCK_REDIS_URL, else $REDIS_URL, else
redis://127.0.0.1:6379 (rediss:// for TLS; redis://user:password@host for ACL).

Exit statuses of run and elect, besides COMMAND's own:
  64  bad usage            70  Redis or other error     75  not acquired (-n busy, -w timed out)
  76  lease lost, or -max-hold reached, while COMMAND ran (COMMAND got SIGTERM,
      then SIGKILL after -grace)
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

func runCmd(args []string, stderr io.Writer) int {
	fs := newFlagSet("run", stderr)
	var c common
	c.register(fs, stderr)
	capacity := fs.Int64("capacity", 1, "how many permits NAME has; 1 makes it a mutex")
	permits := fs.Int64("permits", 1, "how many permits COMMAND takes")
	wait := fs.Duration("w", 0, "give up waiting after this long (exit 75); 0 waits forever")
	nowait := fs.Bool("n", false, "do not wait: exit 75 at once if NAME is busy")
	ttl := fs.Duration("ttl", fairlock.DefaultLeaseTTL, "lease TTL: how long a crashed fairlock keeps the lock")
	grace := fs.Duration("grace", 10*time.Second, "after a lost lease, how long COMMAND has between SIGTERM and SIGKILL")
	maxHold := fs.Duration("max-hold", 0, "end the lease this long after the grant even if COMMAND still runs (SIGTERM, exit 76); 0: no cap")
	name, command, ok := commandArgs(fs, args, "run", stderr)
	if !ok {
		return exitUsage
	}

	rdb, fc, err := c.connect(fairlock.WithLeaseTTL(*ttl), fairlock.WithMaxHold(*maxHold))
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer rdb.Close()
	defer fc.Close()
	req := fairlock.Request{Name: name, Capacity: *capacity, Permits: *permits}
	if err := fc.Validate(req); err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}

	// While waiting, SIGINT and SIGTERM end the wait (leaving the queue).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	lease, code := interruptible(sigs, *wait, stderr, func(ctx context.Context) (*fairlock.Lease, error) {
		if *nowait {
			return fc.TryAcquire(ctx, req)
		}
		return fc.Acquire(ctx, req)
	})
	if lease == nil {
		return code
	}

	status := runUnder(lease, command, sigs, *grace, stderr)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if err := lease.Release(rctx); err != nil && status != exitLeaseLost {
		if errors.Is(err, fairlock.ErrLeaseLost) {
			fmt.Fprintln(stderr, errLine(err))
			return exitLeaseLost
		}
		fmt.Fprintln(stderr, errLine(err))
	}
	return status
}

// commandArgs parses fs's flags from args and splits what follows into
// NAME -- COMMAND [ARGS...]; it prints a usage line and returns ok false
// when they do not fit.
func commandArgs(fs *flag.FlagSet, args []string, verb string, stderr io.Writer) (name string, command []string, ok bool) {
	if err := fs.Parse(args); err != nil {
		return "", nil, false
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		fmt.Fprintf(stderr, "fairlock %s: want NAME -- COMMAND [ARGS...]\n", verb)
		return "", nil, false
	}
	return rest[0], rest[2:], true
}

// interruptible runs take (an Acquire or a Campaign) with a context that
// ends after wait (if > 0) or when a signal arrives on sigs. It returns
// what take got, or nil and the exit status: exitNotGot when the wait ran
// out or the permits were busy (TryAcquire), 128+signal when a signal ended
// it, exitUsage for a bad argument, exitError otherwise.
func interruptible[T any](sigs <-chan os.Signal, wait time.Duration, stderr io.Writer, take func(context.Context) (*T, error)) (*T, int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if wait > 0 {
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	var interrupted os.Signal
	stopWatch, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-stopWatch:
		}
	}()
	got, err := take(ctx)
	close(stopWatch)
	<-watched
	switch {
	case err == nil:
		return got, 0
	case errors.Is(err, fairlock.ErrInvalidArgument):
		fmt.Fprintln(stderr, errLine(err))
		return nil, exitUsage
	case errors.Is(err, fairlock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		return nil, exitNotGot
	case errors.Is(err, context.Canceled) && interrupted != nil:
		return nil, 128 + int(interrupted.(syscall.Signal))
	default:
		fmt.Fprintln(stderr, errLine(err))
		return nil, exitError
	}
}

// runUnder runs command while lease is held and returns the exit status.
func runUnder(lease *fairlock.Lease, command []string, sigs <-chan os.Signal, grace time.Duration, stderr io.Writer) int {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		fmt.Sprintf("FAIRLOCK_TOKEN=%d", lease.Token()),
		"FAIRLOCK_NAME="+lease.Name())
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitNoCommand
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	lost := false
	var kill <-chan time.Time
	for {
		select {
		case err := <-exited:
			if lost {
				return exitLeaseLost
			}
			return exitStatus(cmd, err)
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case <-lease.Done():
			if lost {
				continue
			}
			lost = true
			fmt.Fprintf(stderr, "%s; stopping %s\n", errLine(lease.Err()), command[0])
			_ = cmd.Process.Signal(syscall.SIGTERM)
			kill = time.After(grace)
		case <-kill:
			_ = cmd.Process.Kill()
		}
	}
}

func exitStatus(cmd *exec.Cmd, err error) int {
	if err == nil {
		return 0
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	return exitError
}

func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("status", stderr)
	var c common
	c.register(fs, stderr)
	asJSON := fs.Bool("json", false, "print JSON: one object per NAME, in an array")
	watch := fs.Duration("watch", 0, "refresh at this interval until interrupted (0: print once)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	names := fs.Args()
	if len(names) == 0 {
		fmt.Fprintln(stderr, "fairlock status: want at least one NAME")
		return exitUsage
	}
	rdb, fc, err := c.connect()
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer rdb.Close()
	defer fc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for {
		var all []status
		for _, name := range names {
			st, err := readStatus(ctx, fc, name)
			if err != nil {
				if ctx.Err() != nil {
					return 0
				}
				fmt.Fprintln(stderr, errLine(err))
				return exitError
			}
			all = append(all, st)
		}
		if *watch > 0 && !*asJSON {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear the screen
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			if err := enc.Encode(all); err != nil {
				fmt.Fprintln(stderr, errLine(err))
				return exitError
			}
		} else {
			printTable(stdout, all)
		}
		if *watch <= 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*watch):
		}
	}
}

// status is what status prints of one NAME: the semaphore's Status and,
// if NAME is an election with a leader, the leader.
type status struct {
	fairlock.Status
	Leader *election.Info `json:"leader,omitempty"`
}

func readStatus(ctx context.Context, fc *fairlock.Client, name string) (status, error) {
	st, err := fc.Status(ctx, name)
	if err != nil || len(st.Holders) != 1 {
		return status{Status: st}, err
	}
	e, err := election.New(fc, name)
	if err != nil {
		return status{Status: st}, err
	}
	info, err := e.Leader(ctx)
	switch {
	case errors.Is(err, election.ErrNoLeader):
		return status{Status: st}, nil
	case err != nil:
		return status{Status: st}, err
	}
	return status{Status: st, Leader: &info}, nil
}

func printTable(w io.Writer, all []status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, st := range all {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		if st.Capacity == 0 {
			fmt.Fprintf(tw, "%s: idle\n", st.Name)
			continue
		}
		fmt.Fprintf(tw, "%s: %d of %d permits held, %d waiting", st.Name, st.InUse, st.Capacity, st.Queued)
		if st.Queued > 0 {
			fmt.Fprintf(tw, ", the oldest for %v", st.OldestWait.Round(time.Millisecond))
		}
		fmt.Fprintln(tw)
		if st.Leader != nil {
			fmt.Fprintf(tw, "  leader %s, term %d\n", st.Leader.Value, st.Leader.Term)
		}
		if len(st.Holders) > 0 {
			fmt.Fprintln(tw, "  HOLDER\tPERMITS\tTOKEN\tHELD FOR\tEXPIRES IN\t")
			for _, h := range st.Holders {
				fmt.Fprintf(tw, "  %s\t%d\t%d\t%v\t%v\t\n", h.Owner, h.Permits, h.Token, h.HeldFor.Round(time.Millisecond), h.ExpiresIn)
			}
		}
		if len(st.Waiters) > 0 {
			fmt.Fprintln(tw, "  POSITION\tWAITER\tPERMITS\tWAITING SINCE\t")
			for j, wt := range st.Waiters {
				fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\t\n", j+1, wt.Owner, wt.Permits, wt.Since.Format(time.RFC3339Nano))
			}
		}
	}
	tw.Flush()
}

func electCmd(args []string, stderr io.Writer) int {
	fs := newFlagSet("elect", stderr)
	var c common
	c.register(fs, stderr)
	value := fs.String("value", "", "the value this candidate leads with, shown by status (default host:pid)")
	wait := fs.Duration("w", 0, "give up campaigning after this long (exit 75); 0 waits forever")
	ttl := fs.Duration("ttl", fairlock.DefaultLeaseTTL, "lease TTL: how long a crashed leader keeps leading")
	grace := fs.Duration("grace", 10*time.Second, "after leadership is lost, how long COMMAND has between SIGTERM and SIGKILL")
	name, command, ok := commandArgs(fs, args, "elect", stderr)
	if !ok {
		return exitUsage
	}
	rdb, fc, err := c.connect(fairlock.WithLeaseTTL(*ttl))
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	defer rdb.Close()
	defer fc.Close()
	e, err := election.New(fc, name)
	if err != nil {
		fmt.Fprintln(stderr, errLine(err))
		return exitUsage
	}
	if *value == "" {
		host, _ := os.Hostname()
		*value = fmt.Sprintf("%s:%d", host, os.Getpid())
	}

	// While campaigning, SIGINT and SIGTERM end the wait (leaving the queue).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	l, code := interruptible(sigs, *wait, stderr, func(ctx context.Context) (*election.Leadership, error) {
		return e.Campaign(ctx, *value)
	})
	if l == nil {
		return code
	}

	// The command runs while the election's lease is held; FAIRLOCK_TOKEN
	// is the lease's token, which is the term.
	status := runUnder(l.Lease(), command, sigs, *grace, stderr)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if err := l.Resign(rctx); err != nil && status != exitLeaseLost {
		fmt.Fprintln(stderr, errLine(err))
		if errors.Is(err, fairlock.ErrLeaseLost) {
			return exitLeaseLost
		}
	}
	return status
}
