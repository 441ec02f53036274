package redisserver

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// MoveSlot migrates hash slot slot, with its keys, to the node at index
// to, the way redis-cli --cluster reshard does: IMPORTING and MIGRATING,
// MIGRATE of every key, then SETSLOT NODE on every master.
func (c *Cluster) MoveSlot(ctx context.Context, slot, to int) error {
	return c.MigrateSlot(ctx, slot, to, Migration{})
}

// A Migration says how MigrateSlot moves a slot: how many keys each
// MIGRATE carries and how long it pauses while the slot is half-moved, so
// that commands run on the MIGRATING source and the IMPORTING target in
// between.
type Migration struct {
	// Batch is the number of keys per MIGRATE (default 100).
	Batch int
	// Hold is how long the slot stays open (IMPORTING on the target,
	// MIGRATING on the source) before the first key moves.
	Hold time.Duration
	// Pause is the time between two MIGRATE batches.
	Pause time.Duration
	// Replace sends MIGRATE with REPLACE, overwriting a key the target
	// already has; without it such a key fails the move (BUSYKEY), as in
	// redis-cli --cluster reshard without --cluster-replace.
	Replace bool
	// Hook, if not nil, is called at each step of the move, on the
	// goroutine of MigrateSlot.
	Hook func(MigrationStep)
}

// A MigrationStep is one moment of a slot migration, told to
// Migration.Hook.
type MigrationStep struct {
	Slot       int
	From, To   int    // node indexes
	Phase      string // "open", "batch" or "closed"
	Moved      int    // keys migrated so far
	SourceAddr string
	TargetAddr string
}

// MigrateSlot migrates hash slot slot, with its keys, to the node at index
// to, step by step as redis-cli --cluster reshard does: SETSLOT IMPORTING
// on the target and MIGRATING on the source (phase "open"), MIGRATE of the
// source's keys in the slot m.Batch at a time (phase "batch" after each),
// then SETSLOT NODE on the target, the source and every other node (phase
// "closed"). It returns the first error a step returns; the slot may then
// be left open, which a later MigrateSlot of the same slot does not repair.
func (c *Cluster) MigrateSlot(ctx context.Context, slot, to int, m Migration) error {
	if m.Batch <= 0 {
		m.Batch = 100
	}
	clients := make([]*redis.Client, len(c.Nodes))
	ids := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr})
		defer clients[i].Close()
		id, err := clients[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return err
		}
		ids[i] = id
	}
	from, err := c.NodeOf(ctx, slot)
	if err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("slot %d is on node %d already", slot, to)
	}
	step := MigrationStep{Slot: slot, From: from, To: to, SourceAddr: c.Nodes[from].Addr, TargetAddr: c.Nodes[to].Addr}
	hook := func(phase string) {
		if m.Hook != nil {
			step.Phase = phase
			m.Hook(step)
		}
	}
	pause := func(d time.Duration) error {
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	src, dst := clients[from], clients[to]
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return err
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err(); err != nil {
		return err
	}
	hook("open")
	if err := pause(m.Hold); err != nil {
		return err
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, m.Batch).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", c.Nodes[to].Port, "", 0, 5000}
		if m.Replace {
			args = append(args, "REPLACE")
		}
		args = append(args, "KEYS")
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE: %w", err)
		}
		step.Moved += len(keys)
		hook("batch")
		if err := pause(m.Pause); err != nil {
			return err
		}
	}
	order := []int{to, from}
	for i := range c.Nodes {
		if i != to && i != from {
			order = append(order, i)
		}
	}
	for _, i := range order {
		if err := clients[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err(); err != nil {
			return err
		}
	}
	hook("closed")
	return nil
}

// NodeOf returns the index of the node that owns slot.
func (c *Cluster) NodeOf(ctx context.Context, slot int) (int, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
	defer rdb.Close()
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return -1, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int64(slot) < r.Start || int64(slot) > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				for i, s := range c.Nodes {
					if n.Role == "master" && int(n.Port) == s.Port {
						return i, nil
					}
				}
			}
		}
	}
	return -1, fmt.Errorf("no node owns slot %d", slot)
}
