package fairlock

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ringOptions is a type that describes its options as a Ring's.
type ringOptions interface {
	Options() *redis.RingOptions
}

// ringShards is the pair of methods that only a Ring has among go-redis's
// clients: membership that changes (SetAddrs) and a shard chosen per key.
type ringShards interface {
	SetAddrs(addrs map[string]string)
	GetShardClientForKey(key string) (*redis.Client, error)
}

// A *redis.Ring has both, so ringError needs no case of its own for it; if
// go-redis renames these methods, this fails to compile rather than
// ringError silently letting a Ring through.
var (
	_ ringOptions = (*redis.Ring)(nil)
	_ ringShards  = (*redis.Ring)(nil)
)

// ringError returns an error matching [ErrInvalidArgument] when rdb is a
// go-redis Ring or shows itself as one, and nil otherwise. [New] refuses a
// Ring because a Ring marks a shard down when its heartbeat fails a few
// times (about 1.5 s with go-redis's defaults) and sends that shard's keys
// to another shard, which holds none of their state. A client cut off from
// the shard that keeps a mutex is then granted the mutex on another shard
// while its holder, which still reaches the first shard, goes on holding
// and renewing it there: two live holders for as long as the partition
// lasts, with every server keeping every write. A shard paused past the
// heartbeat does the same to every client. No script can see it: each
// shard is right about the keys it has.
//
// Recognised: a *redis.Ring, and any type with Ring's Options method
// (returning *redis.RingOptions) or with both its SetAddrs and
// GetShardClientForKey methods, as a struct that embeds a *redis.Ring has.
// A wrapper that keeps a Ring in a field and shows none of these methods
// cannot be recognised.
func ringError(rdb RedisClient) error {
	switch rdb.(type) {
	case ringOptions, ringShards:
	default:
		return nil
	}
	return fmt.Errorf("%w: %T is a go-redis Ring or wraps one; a Ring moves a shard's keys to another shard "+
		"when it thinks that shard is down, so two processes could hold one lock at once; "+
		"use a *redis.ClusterClient, a Sentinel failover client, or one *redis.Client per shard "+
		"with the semaphore names you place on it yourself",
		ErrInvalidArgument, rdb)
}
