package fairlock

import (
	"strings"
	"testing"

	"github.com/fairlock/fairlock/internal/keyspace"
	"pgregory.net/rapid"
)

// The channel WithReplicaAck publishes to is no object's name: every
// channel fairlock subscribes to (an election's) is derived from its
// object's keys, so it holds keyspace.Sep, which the ack channel does
// not; so no valid name and prefix make an election hear the
// acknowledgements' messages.
func TestAckChannelIsNoObjectsChannel(t *testing.T) {
	if strings.Contains(ackChannel, keyspace.Sep) {
		t.Fatalf("the ack channel %q holds keyspace.Sep", ackChannel)
	}
	rapid.Check(t, func(t *rapid.T) {
		prefix := rapid.String().Draw(t, "prefix")
		name := rapid.StringN(1, 40, -1).Draw(t, "name")
		k, err := keyspace.For(prefix, name)
		if err != nil {
			t.Skip("not a valid name")
		}
		if ch := leaderChannel(k); ch == ackChannel || !strings.Contains(ch, keyspace.Sep) {
			t.Fatalf("election %q (prefix %q) has channel %q", name, prefix, ch)
		}
	})
}
