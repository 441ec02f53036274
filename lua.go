package fairlock

import (
	"embed"

	"github.com/fairlock/fairlock/internal/script"
)

// The engine's Lua sources: queue.lua's header maps them; the script
// library (internal/script) assembles them into its scripts and functions.
//
//go:embed queue.lua acquire.lua release.lua lua
var luaFiles embed.FS

func init() { script.SetSources(luaFiles) }
