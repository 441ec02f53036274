package main

import (
	"fmt"
	"strings"
)

// The series the figures draw: every implementation (impls) and every
// reference measured beside them, each with a style of its own, the same
// in every figure, so that a reader can tell any two apart in any figure
// (a test checks that every name the bench can draw has one, and that no
// two share it).

// The references' names.
const (
	refFIFOFloor         = "FIFO floor (reference)"
	refFIFOFloorCommands = "FIFO floor + fairlock's commands (reference)"
	refFloorFunctions    = "floor functions (reference)"
	refLeastScript       = "least script lock (reference)"
	refBareBlockingRead  = "bare blocking read (reference)"
	queueRefSize         = 10 // waiters of the queue table's reference semaphore
)

// queueRefName names the queue table's reference: a semaphore with n
// waiters.
func queueRefName(n int) string { return fmt.Sprintf("%d-waiter reference", n) }

// referenceNames lists every reference series the bench can draw.
func referenceNames() []string {
	return []string{refFIFOFloor, refFIFOFloorCommands, refFloorFunctions, refLeastScript, refBareBlockingRead, queueRefName(queueRefSize)}
}

type style struct {
	color string
	dash  string // an SVG stroke-dasharray; "" for a solid line
}

// palette gives each series its style. The implementations are solid, in
// the Okabe–Ito colours (readable to most colour-blind eyes) and, past
// those, Paul Tol's; fairlock on the other clients in lighter blues of
// its own. The references are dashed, each in its own grey or muted
// colour and dash, so that two references in one figure differ too.
var palette = map[string]style{
	"fairlock":         {color: "#0072B2"},
	"fairlock-rueidis": {color: "#56B4E9"},
	"fairlock-valkey":  {color: "#332288"},
	"fairlock-batched": {color: "#661100"},
	autopipeName:       {color: "#117733", dash: "4 2"},
	"redsync":          {color: "#E69F00"},
	"redislock":        {color: "#009E73"},
	"setnx":            {color: "#CC79A7"},
	"rueidislock":      {color: "#D55E00"},
	"valkeylock":       {color: "#882255"},

	refFIFOFloor:               {color: "#555555", dash: "6 4"},
	refFIFOFloorCommands:       {color: "#999999", dash: "2 3"},
	refFloorFunctions:          {color: "#44AA99", dash: "6 4"},
	refLeastScript:             {color: "#999933", dash: "2 3"},
	refBareBlockingRead:        {color: "#000000", dash: "6 4"},
	queueRefName(queueRefSize): {color: "#777777", dash: "8 3 2 3"},
}

// unknownStyle draws a series the palette does not name (a new one the
// palette has not been told of: the palette test fails for it).
var unknownStyle = style{color: "#DDCC77", dash: "1 2"}

// implStyle is the style of the series name.
func implStyle(name string) style {
	if st, ok := palette[name]; ok {
		return st
	}
	if strings.Contains(name, "reference") {
		return style{color: "#555555", dash: "6 4"}
	}
	return unknownStyle
}
