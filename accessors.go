package fairlock

import "time"

// These accessors let packages built on the engine (package election)
// keep state of their own next to a semaphore's, in the same hash tag, on
// the same go-redis client.

// Redis returns the go-redis client given to [New]. It stays the
// caller's: closing it is not the Client's business.
func (c *Client) Redis() RedisClient { return c.rdb }

// KeyBase validates name as [Client.Acquire] does and returns the start
// that every Redis key of the semaphore name shares: the prefix and the
// hash-tagged name, such as "fairlock:{jobs}" or "fairlock:{acct}:17".
// The engine's own keys are KeyBase plus ":" and one or two letters (see
// the package doc); a package built on it may keep keys of its own at
// KeyBase plus ":" and a suffix the engine does not use, which then share
// the semaphore's hash slot. It fails with [ErrInvalidName] for a name
// the engine refuses, and contacts no server.
func (c *Client) KeyBase(name string) (string, error) {
	k, err := c.keys(name)
	if err != nil {
		return "", err
	}
	return k.base, nil
}

// LeaseTTL returns how long a grant of c lasts without renewal (see
// [WithLeaseTTL]).
func (c *Client) LeaseTTL() time.Duration { return c.cfg.leaseTTL }
