package fairlock

import "time"

// LeaseTTL returns how long a grant of c lasts without renewal (see
// [WithLeaseTTL]), unless its request gave a TTL of its own
// ([Request.LeaseTTL]).
func (c *Client) LeaseTTL() time.Duration { return c.cfg.leaseTTL }
