package script

import (
	"io/fs"
	"strings"

	"github.com/fairlock/fairlock/internal/testhook"
)

// luaFiles holds the scripts' sources (queue.lua's header maps them),
// which the root package embeds and hands over (SetSources) before any
// script is made. Each entry's script is queue.lua, then Includes in
// order, then the entry.
var luaFiles fs.FS

// SetSources gives the library the scripts' sources: queue.lua,
// acquire.lua, release.lua and lua/ at fsys's root. It is called once,
// from the root package's init.
func SetSources(fsys fs.FS) { luaFiles = fsys }

// EntryOf names the entry whose whole script source (ScriptSource) src
// is, the entry's name followed by testhook.BatchSuffix for its batch
// form (BatchSource), or "" (tests only; see internal/testhook).
func EntryOf(src string) string {
	for _, e := range Entries {
		if strings.HasSuffix(src, EntryBody(Source(e.File))) {
			return e.Name
		}
		if e.Batch && strings.HasSuffix(src, BatchBody(Source(e.File))) {
			return e.Name + testhook.BatchSuffix
		}
	}
	return ""
}

// Source returns the text of one of the scripts' files.
func Source(file string) string {
	b, err := fs.ReadFile(luaFiles, file)
	if err != nil {
		panic("fairlock: " + err.Error())
	}
	return string(b)
}

// ScriptSource returns the EVAL source of entry e: queue.lua, the
// includes, then e's file as the body that queue.lua's run_entry runs.
func ScriptSource(e Entry) string {
	return Prelude(Source) + "\n" + EntryBody(Source(e.File))
}

// Prelude is the code every script defines before its entry: queue.lua,
// then the includes in order, each file's text as read returns it. The
// EVAL scripts and the function library (NewLibrary) are both made of
// it, assembled here only.
func Prelude(read func(file string) string) string {
	parts := []string{read("queue.lua")}
	for _, f := range Includes {
		parts = append(parts, read(f))
	}
	return strings.Join(parts, "\n")
}

// BatchSource returns the EVAL source of entry e's batch form: queue.lua,
// the includes, then e's file as the body that lua/batch.lua's run_batch
// runs once for each call of a batch.
func BatchSource(e Entry) string {
	return Prelude(Source) + "\n" + BatchBody(Source(e.File))
}

// BatchBody wraps an entry file's text as the body run_batch runs for
// each call of a batch, as EntryBody does for one call.
func BatchBody(src string) string {
	return "return run_batch(function(KEYS, ARGV)\n" + src + "\nend, KEYS, ARGV)"
}

// EntryBody wraps an entry file's text as the function run_entry runs
// (queue.lua), called with the script's KEYS and ARGV. The wrapper takes
// no line of its own before the entry, so errors keep its line numbers
// less one.
func EntryBody(src string) string {
	return "return run_entry(function(KEYS, ARGV)\n" + src + "\nend, KEYS, ARGV)"
}
