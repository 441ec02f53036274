package election_test

import (
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A leader campaigning again under its leadership's lease would wait for
// itself: Campaign fails at once with ErrDeadlock.
func TestCampaignUnderOwnLeadership(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		el := e.election(e.Client(), "again")
		ctx := fltest.Bounded(t)
		lead, err := el.Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel := fairlock.LeaseContext(ctx, lead.Lease())
		defer cancel()
		_, err = el.Campaign(lctx, "b")
		fltest.Deadlocked(t, "Campaign under the leadership's lease", err, "acquire", []string{"again"}, lead.Term(), "again")
		if err := lead.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
