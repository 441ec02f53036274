package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/backend"
	"github.com/redis/go-redis/v9"
)

// autopipeName is the row of fairlock whose script calls ride go-redis's
// (experimental) autopipeliner: a measurement of what a call path that
// pipelines the calls of concurrent goroutines on go-redis would cost,
// beside the library's own path (a command per call on a pooled
// connection). Its Backend lives here, not in the library.
const autopipeName = "fairlock-autopipe"

// apBackend is a backend.Backend on a go-redis client whose script calls
// go through the client's autopipeliner (Submit, then WaitContext: the
// caller returns by its context's end while the call stays in its batch)
// and whose blocking reads go through the client itself.
type apBackend struct {
	rdb *redis.Client
	ap  *redis.AutoPipeliner
	cnt *counter
}

func openFairlockAutopipe(rdb *redis.Client, prefix string) (locker, error) {
	o := *rdb.Options()
	own := redis.NewClient(&o)
	ap, err := own.AsyncAutoPipeline()
	if err != nil {
		_ = own.Close()
		return nil, fmt.Errorf("autopipeline: %w", err)
	}
	b := &apBackend{rdb: own, ap: ap, cnt: counterOf(rdb)}
	c, err := fairlock.NewWithBackend(b, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(leaseTTL))
	if err != nil {
		_ = ap.Close()
		_ = own.Close()
		return nil, err
	}
	return &fairlockLocker{c: c, after: func() { _ = ap.Close(); _ = own.Close() }}, nil
}

func (b *apBackend) Info() backend.Info {
	return backend.Info{Layout: backend.Single, Functions: true, Deadlines: true}
}

// replyOf reads a go-redis command's outcome as a Backend returns it.
func replyOf(v any, err error) (any, error) {
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return nil, &backend.ReplyError{Reply: rerr.Error(), Err: err}
	}
	return v, err
}

func (b *apBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	name := map[backend.Command]string{backend.FCall: "fcall", backend.EvalSHA: "evalsha", backend.Eval: "eval"}[s.Command]
	argv := make([]any, 0, 3+len(s.Keys)+len(s.Args))
	argv = append(argv, name, s.Name, len(s.Keys))
	for _, k := range s.Keys {
		argv = append(argv, k)
	}
	for _, a := range s.Args {
		argv = append(argv, a)
	}
	b.cnt.n.Add(1)
	cmd := redis.NewCmd(ctx, argv...)
	if err := b.ap.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil, err
	}
	return replyOf(cmd.Result())
}

func (b *apBackend) ScriptWait(ctx context.Context, s backend.Script, replicas int, timeout time.Duration) (any, int64, error, error) {
	err := fmt.Errorf("%w: WAIT through the autopipeliner", errors.ErrUnsupported)
	return nil, 0, err, err
}

func (b *apBackend) LoadLibrary(ctx context.Context, code string) error {
	err := b.rdb.FunctionLoad(ctx, code).Err()
	if err != nil && errors.As(err, new(redis.Error)) && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	_, err = replyOf(nil, err)
	return err
}

func (b *apBackend) BlockingPop(ctx context.Context, timeout time.Duration, count int, keys []string) (string, []string, error) {
	b.cnt.n.Add(1)
	if count > 0 {
		key, vals, err := b.rdb.BLMPop(ctx, timeout, "left", int64(count), keys...).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil, nil
		}
		_, err = replyOf(nil, err)
		return key, vals, err
	}
	res, err := b.rdb.BLPop(ctx, timeout, keys...).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil, nil
	}
	if _, err := replyOf(nil, err); err != nil {
		return "", nil, err
	}
	return res[0], res[1:], nil
}

func (b *apBackend) Pop(ctx context.Context, key string, count int) ([]string, error) {
	b.cnt.n.Add(1)
	got, err := b.rdb.LPopCount(ctx, key, count).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	_, err = replyOf(nil, err)
	return got, err
}

func (b *apBackend) Blocking() (backend.Backend, func() error, error) { return nil, nil, nil }
