package fairlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// library is the engine's scripts as one Redis function library (Redis 7.0
// and later, Valkey): loaded once per server, so that a call no longer
// defines queue.lua's functions afresh as an EVAL does. queue.lua,
// acquire.lua and release.lua stay the sources; the library wraps them
// (see libraryFormat). Its name and its functions' names carry a hash of
// the sources, so fairlock versions that differ in them can share one
// Redis (a rolling upgrade): each loads its own library, and none replaces
// another's.
type library struct {
	name             string // fairlock_<hash>
	acquire, release string // function names
	code             string // FUNCTION LOAD's argument
}

// libraryFormat wraps the sources (queue.lua, acquire.lua, release.lua,
// then the hash). acquire.lua and release.lua become the bodies of the two
// functions, which start with begin(KEYS) as a script does. queue.lua's
// definitions are made once per server, by define, at the first call: not
// when the library loads, since a library's top level sees only
// redis.register_function and its kin (not unpack, string or math), and
// queue.lua may use those at its top level as a script may.
//
// The functions declare no flags: they write (so Redis refuses them at
// once, before any write, when over maxmemory), and like the scripts they
// touch keys not in KEYS in the slot of those declared, which a function
// may do as a script may (Cluster checks the slot of every key, declared
// or not).
const libraryFormat = `#!lua name=fairlock_%[4]s
local acquire_fn, release_fn
local function define()
%[1]s
acquire_fn = function(KEYS, ARGV)
%[2]s
end
release_fn = function(KEYS, ARGV)
%[3]s
end
end
redis.register_function{function_name='fairlock_acquire_%[4]s', callback=function(KEYS, ARGV)
  if not acquire_fn then define() end
  return acquire_fn(KEYS, ARGV)
end}
redis.register_function{function_name='fairlock_release_%[4]s', callback=function(KEYS, ARGV)
  if not release_fn then define() end
  return release_fn(KEYS, ARGV)
end}
`

// newLibrary wraps the three sources into a library.
func newLibrary(queue, acquire, release string) *library {
	h := sha1.New()
	for _, s := range []string{libraryFormat, queue, acquire, release} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	hash := hex.EncodeToString(h.Sum(nil))[:16]
	return &library{
		name:    "fairlock_" + hash,
		acquire: "fairlock_acquire_" + hash,
		release: "fairlock_release_" + hash,
		code:    fmt.Sprintf(libraryFormat, queue, acquire, release, hash),
	}
}

// fcaller runs a function: go-redis's clients and pipelines.
type fcaller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

// canLoad reports whether the client runs the library on rdb: only on the
// go-redis clients whose servers it knows how to reach, to load the
// library there. Another RedisClient (a wrapper of the caller's) runs the
// scripts through its own Scripter methods, EVALSHA and EVAL.
func canLoad(rdb RedisClient) bool {
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}

// A failure is what an FCALL's error says of the function.
type failure int

const (
	fnRan         failure = iota // the call ran (or failed on its way): its reply stands
	fnMissing                    // this server has no such function: load the library
	fnUnsupported                // no FCALL here (miniredis, Redis 6.2), or not allowed to this user
)

// fcallFailure reads an FCALL's error.
func fcallFailure(err error) failure {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return fnRan
	}
	msg := rerr.Error()
	switch {
	case strings.HasPrefix(msg, "ERR Function not found"):
		return fnMissing
	case strings.HasPrefix(msg, "ERR unknown command"), strings.HasPrefix(msg, "NOPERM"):
		return fnUnsupported
	}
	return fnRan
}

// A loadResult is what loading the library came to.
type loadResult int

const (
	loadOK      loadResult = iota // loaded, or there already
	loadFailed                    // not now (the connection, a failover, memory): try again next time
	loadRefused                   // never on this Redis: the library does not compile, or FUNCTION is not allowed
)

// load loads the library on every server of rdb that may serve a key: the
// node, every Cluster master (the slot's owner may have changed since it
// was last seen: ForEachMaster reloads the slot map), every Ring shard. A
// library of that name already there is the same code (the name is its
// hash), so "already exists" is success.
func (l *library) load(ctx context.Context, rdb RedisClient) loadResult {
	one := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, l.code).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	var err error
	switch r := rdb.(type) {
	case *redis.Client:
		err = one(ctx, r)
	case *redis.ClusterClient:
		err = r.ForEachMaster(ctx, one)
	case *redis.Ring:
		err = r.ForEachShard(ctx, one)
	}
	var rerr redis.Error
	switch {
	case err == nil:
		return loadOK
	case errors.As(err, &rerr) && (strings.HasPrefix(rerr.Error(), "ERR") || strings.HasPrefix(rerr.Error(), "NOPERM")):
		return loadRefused
	}
	return loadFailed
}
