module github.com/fairlock/fairlock/fairlockvalkey

go 1.26.0


require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/fairlock/fairlock v0.1.0
	github.com/valkey-io/valkey-go v1.0.79
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
