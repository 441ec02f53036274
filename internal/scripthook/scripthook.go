// Package scripthook lets fairlock's tests change the Lua source of the
// scripts that clients created afterwards run: to break a rule on purpose
// (property and mutation tests), or to instrument every redis.call (the
// write-before-error checker). It is internal: programs cannot reach it.
package scripthook

import (
	"strings"
	"sync/atomic"
)

var transform atomic.Pointer[func(src string) string]

// Set makes every Client created from now on run its scripts through f
// (the source of each script, queue.lua included, is passed whole). It
// returns a function that restores the previous transform. Clients created
// before keep the scripts they have.
func Set(f func(src string) string) (restore func()) {
	var p *func(string) string
	if f != nil {
		p = &f
	}
	old := transform.Swap(p)
	return func() { transform.Store(old) }
}

// Get returns the current transform, or nil.
func Get() func(src string) string {
	if p := transform.Load(); p != nil {
		return *p
	}
	return nil
}

// fastPathsOn is the line of queue.lua that turns the scripts' fast paths
// on.
const fastPathsOn = "local FAST_PATHS = true\n"

// NoFastPaths returns src with the scripts' fast paths turned off: every
// call then takes the general path. Tests compose it with other transforms
// to compare the two paths. It panics if src has no fast-path switch, so
// that a test cannot believe it turned off what no longer exists.
func NoFastPaths(src string) string {
	if !strings.Contains(src, fastPathsOn) {
		panic("scripthook: the script has no fast-path switch (" + strings.TrimSpace(fastPathsOn) + ")")
	}
	return strings.Replace(src, fastPathsOn, "local FAST_PATHS = false\n", 1)
}
