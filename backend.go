package fairlock

import (
	"fmt"

	"github.com/fairlock/fairlock/backend"
)

// NewWithBackend returns a Client that keeps its semaphores in Redis
// through b, as [New] does through a go-redis client; see New for the
// options and errors. The Client does not close b; it closes the Backend
// b.Blocking returned, if b made it, in [Client.Close].
// NewWithBackend fails with [ErrInvalidArgument] for a nil b and for
// [WithReplicaAck] when b cannot wait for replicas (backend.Info.Wait).
func NewWithBackend(b backend.Backend, opts ...Option) (*Client, error) {
	if b == nil || isNilPointer(b) {
		return nil, opError("new", nil, fmt.Errorf("%w: nil backend", ErrInvalidArgument))
	}
	return newClient(b, nil, opts)
}
