package main

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// -redis (and $FAIRLOCK_REDIS_URL, $REDIS_URL) takes HOST:PORT as
// redis-cli and most Redis clients' settings give it, a redis:// URL with
// a user, a password and a database, and a Unix socket.
func TestRedisAddressForms(t *testing.T) {
	b := redistest.RealBackend(t)
	c := newCLIOn(t, b.Addr)
	ctx := context.Background()
	held, err := c.lib.Acquire(ctx, fairlock.Request{Name: "x", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	// run -n on the held lock exits 75 once it reached that Redis and
	// database; 0 when it reached another database, where x is free.
	try := func(env []string, args ...string) result {
		t.Helper()
		return runBin(t, env, append(append([]string{"run", "-n", "-prefix", c.prefix}, args...), "x", "--", "true")...)
	}
	for _, addr := range []string{b.Addr, "redis://" + b.Addr, "redis://" + b.Addr + "/0"} {
		if r := try(nil, "-redis", addr); r.code != exitNotGot {
			t.Errorf("run -redis %s on a held lock: exit %d, stderr:\n%s", addr, r.code, r.stderr)
		}
	}
	for _, env := range []string{"FAIRLOCK_REDIS_URL", "REDIS_URL"} {
		if r := try([]string{"FAIRLOCK_REDIS_URL=", "REDIS_URL=", env + "=" + b.Addr}); r.code != exitNotGot {
			t.Errorf("run with $%s=%s on a held lock: exit %d, stderr:\n%s", env, b.Addr, r.code, r.stderr)
		}
	}

	// An ACL user with a password, and a database of its own.
	rdb := redis.NewClient(&redis.Options{Addr: b.Addr})
	defer rdb.Close()
	user := "u" + strings.ToLower(strings.Trim(c.prefix, ":t"))
	user = strings.NewReplacer(":", "", "_", "").Replace(user)
	if err := rdb.Do(ctx, "ACL", "SETUSER", user, "on", ">s3cret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.Do(ctx, "ACL", "DELUSER", user)
	if r := try(nil, "-redis", "redis://"+user+":s3cret@"+b.Addr+"/0"); r.code != exitNotGot {
		t.Fatalf("run as ACL user %s, database 0: exit %d, stderr:\n%s", user, r.code, r.stderr)
	}
	if r := try(nil, "-redis", "redis://"+user+":s3cret@"+b.Addr+"/5"); r.code != 0 {
		t.Fatalf("run as ACL user %s, database 5: exit %d, stderr:\n%s", user, r.code, r.stderr)
	}
	if r := try(nil, "-redis", "redis://"+user+":wrong@"+b.Addr); r.code != exitError || !strings.Contains(r.stderr, "WRONGPASS") {
		t.Fatalf("run with a wrong password: exit %d, stderr:\n%s", r.code, r.stderr)
	}

	// A Unix socket: unix:///PATH (with ?db=N), or the bare path.
	sock := filepath.Join(t.TempDir(), "redis.sock")
	srv, err := redisserver.Start("--unixsocket", sock, "--unixsocketperm", "700")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	onSock := newCLIOn(t, srv.Addr)
	if _, err := onSock.lib.Acquire(ctx, fairlock.Request{Name: "x", Capacity: 1, Permits: 1}); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"unix://" + sock, sock, "unix://" + sock + "?db=0"} {
		r := runBin(t, nil, "run", "-n", "-prefix", onSock.prefix, "-redis", addr, "x", "--", "true")
		if r.code != exitNotGot {
			t.Errorf("run -redis %s on a held lock: exit %d, stderr:\n%s", addr, r.code, r.stderr)
		}
	}
	if r := runBin(t, nil, "run", "-n", "-prefix", onSock.prefix, "-redis", "unix://"+sock+"?db=3", "x", "--", "true"); r.code != 0 {
		t.Fatalf("run -redis unix://%s?db=3: exit %d, stderr:\n%s", sock, r.code, r.stderr)
	}

	// rediss:// is TLS: with nothing listening, Redis is unreachable
	// (exit 70), not a bad address (64).
	if r := runBin(t, nil, "status", "-redis", "rediss://"+down(t), "x"); r.code != exitError {
		t.Fatalf("status -redis rediss://... with nothing listening: exit %d, stderr:\n%s", r.code, r.stderr)
	}

	// A value of no form exits 64 with one line that names where it came
	// from and the forms it may take.
	const forms = "want HOST[:PORT], redis://[USER[:PASSWORD]@]HOST[:PORT][/DB], rediss://... (TLS) or unix:///PATH[?db=DB]"
	for _, tc := range []struct{ env, flag, from string }{
		{"", "not an address", `-redis "not an address"`},
		{"", "http://" + b.Addr, `-redis "http://` + b.Addr + `"`},
		{"", "redis://" + b.Addr + "/x", `-redis "redis://` + b.Addr + `/x"`},
		{"", "127.0.0.1:99999", `-redis "127.0.0.1:99999"`},
		{"", "127.0.0.1:", `-redis "127.0.0.1:"`},
		{"REDIS_URL=redis//oops", "", `$REDIS_URL "redis//oops"`},
		{"FAIRLOCK_REDIS_URL=a b", "", `$FAIRLOCK_REDIS_URL "a b"`},
	} {
		args := []string{"status"}
		if tc.flag != "" {
			args = append(args, "-redis", tc.flag)
		}
		r := runBin(t, []string{"FAIRLOCK_REDIS_URL=", "REDIS_URL=", tc.env}, append(args, "x")...)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != exitUsage || len(lines) != 1 || !strings.HasPrefix(lines[0], "fairlock: bad Redis address "+tc.from+": ") || !strings.HasSuffix(lines[0], forms) {
			t.Errorf("status with %s: exit %d, stderr:\n%s", tc.from, r.code, r.stderr)
		}
	}
}

// down returns a loopback address where nothing listens.
func down(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// -cluster and -sentinel take the forms Redis users know: a list of nodes
// (or sentinels, port 26379 by default, with -master), or a redis:// URL
// as go-redis reads it; a form that does not fit is refused with the
// forms it may take.
func TestClusterAndSentinelForms(t *testing.T) {
	for _, tc := range []struct {
		cluster, sentinel, master, url string
		want                           string // where Redis is, as dial names it; "" for refused
	}{
		{cluster: "10.0.0.1:7000,10.0.0.2:7001", want: "the Cluster at 10.0.0.1:7000,10.0.0.2:7001"},
		{cluster: "node-a, node-b:7001", want: "the Cluster at node-a:6379,node-b:7001"},
		{cluster: "redis://u:p@10.0.0.1:7000?addr=10.0.0.2:7001", want: "the Cluster at 10.0.0.1:7000,10.0.0.2:7001"},
		{cluster: "[::1]:7000,::1", want: "the Cluster at [::1]:7000,[::1]:6379"},
		{sentinel: "s1,s2:26380", master: "mymaster", want: `master "mymaster" of the sentinels at s1:26379,s2:26380`},
		{sentinel: "redis://10.0.0.1:26379?master_name=m&addr=10.0.0.2:26379", want: `master "m" of the sentinels at 10.0.0.1:26379,10.0.0.2:26379`},
		{url: "10.0.0.1", want: "Redis at 10.0.0.1:6379"},
		{sentinel: "s1"},                               // no master
		{master: "m"},                                  // no sentinels
		{cluster: "a:1", url: "b:2"},                   // two places
		{cluster: "a:1", sentinel: "b", master: "m"},   // two places
		{cluster: "a:1,,b:2"},                          // an empty address
		{cluster: "a:99999"},                           // a bad port
		{cluster: "http://a:1"},                        // not a Redis URL
		{sentinel: "redis://a:1?bogus=1", master: "m"}, // an unknown option
	} {
		c := &common{url: tc.url, cluster: tc.cluster, sentinel: tc.sentinel, master: tc.master}
		rdb, where, err := c.dial()
		if rdb != nil {
			rdb.Close()
		}
		switch {
		case tc.want == "" && !errors.Is(err, errBadAddress):
			t.Errorf("%+v: dial = %q, %v; want an error matching errBadAddress", tc, where, err)
		case tc.want != "" && (err != nil || where != tc.want):
			t.Errorf("%+v: dial = %q, %v; want %q", tc, where, err, tc.want)
		}
	}
}

// fairlock run and status on a real Redis Cluster, given by -cluster.
func TestRunOnCluster(t *testing.T) {
	redistest.Long(t)
	cl, err := redisserver.StartCluster(3)
	if err != nil {
		t.Skipf("no Redis Cluster: %v", err)
	}
	defer cl.Stop()
	prefix := redistest.Prefix(t)
	seeds := strings.Join(cl.Addrs()[:2], ",")
	var out []string
	for _, name := range []string{"a", "b", "c", "d"} { // names in several slots
		r := runBin(t, nil, "run", "-cluster", seeds, "-prefix", prefix, name, "--", "sh", "-c", `echo "$FAIRLOCK_TOKEN"`)
		if r.code != 0 {
			t.Fatalf("run -cluster %s %s: exit %d, stderr:\n%s", seeds, name, r.code, r.stderr)
		}
		out = append(out, strings.TrimSpace(r.stdout))
	}
	if r := runBin(t, nil, "status", "-cluster", "redis://"+cl.Addrs()[2], "-prefix", prefix, "a", "d"); r.code != 0 {
		t.Fatalf("status -cluster: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	t.Logf("tokens %v", out)
}

// fairlock run and status on a Sentinel set's master, given by -sentinel
// and -master.
func TestRunOnSentinel(t *testing.T) {
	redistest.Long(t)
	set, err := redisserver.StartSentinel(5 * time.Second)
	if err != nil {
		t.Skipf("no Sentinel set: %v", err)
	}
	defer set.Stop()
	prefix := redistest.Prefix(t)
	sentinels := strings.Join(set.SentinelAddrs(), ",")
	r := runBin(t, nil, "run", "-sentinel", sentinels, "-master", redisserver.MasterName, "-prefix", prefix, "x", "--", "sh", "-c", `echo "$FAIRLOCK_TOKEN"`)
	if r.code != 0 || strings.TrimSpace(r.stdout) == "" {
		t.Fatalf("run -sentinel %s -master %s: exit %d, stdout %q, stderr:\n%s", sentinels, redisserver.MasterName, r.code, r.stdout, r.stderr)
	}
	// The lock was kept on the master.
	rdb := redis.NewClient(&redis.Options{Addr: set.Master.Addr})
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of the lock on the master %s: %v, %v; want some", set.Master.Addr, keys, err)
	}
	url := "redis://" + set.SentinelAddrs()[0] + "?master_name=" + redisserver.MasterName
	if r := runBin(t, nil, "status", "-sentinel", url, "-prefix", prefix, "x"); r.code != 0 {
		t.Fatalf("status -sentinel %s: exit %d, stderr:\n%s", url, r.code, r.stderr)
	}
	t.Logf("token %s; keys on the master: %v", strings.TrimSpace(r.stdout), keys)
}
