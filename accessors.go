package fairlock

import "time"

// LeaseTTL returns how long a grant of c lasts without renewal (see
// [WithLeaseTTL]).
func (c *Client) LeaseTTL() time.Duration { return c.cfg.leaseTTL }
