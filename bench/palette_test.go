package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
)

// Every series the bench can draw (each implementation it knows and each
// reference it measures beside them) has a style of its own in the
// palette, and no two share one, so any two series can be told apart in
// any figure; and the palette names nothing else, so that a new series
// must be added to both lists.
func TestEverySeriesHasItsOwnStyle(t *testing.T) {
	var names []string
	for _, im := range impls() {
		names = append(names, im.name)
	}
	names = append(names, referenceNames()...)
	seen := map[style]string{}
	for _, n := range names {
		st, ok := palette[n]
		if !ok {
			t.Errorf("series %q has no style of its own in the palette (it would be drawn %v)", n, implStyle(n))
			continue
		}
		if other, ok := seen[st]; ok {
			t.Errorf("series %q and %q share the style %v", n, other, st)
		}
		seen[st] = n
		if st == unknownStyle {
			t.Errorf("series %q has the style of an unknown series", n)
		}
		if implStyle(n) != st {
			t.Errorf("implStyle(%q) = %v, want the palette's %v", n, implStyle(n), st)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(palette)) {
		if !slices.Contains(names, n) {
			t.Errorf("the palette names %q, which is neither an implementation nor a reference", n)
		}
	}
}

// Bar labels never overlap one another, and stay within the plot: every
// label is in its own bar's column (across when the text fits the bar,
// upwards when it does not, none when the bar is narrower than a line of
// text), and the scale leaves room above the tallest bar. Checked on the
// scale figure's shape (every implementation, several groups) and on
// wider and narrower bars.
func TestBarLabelsDoNotOverlap(t *testing.T) {
	var names []string
	for _, im := range impls() {
		names = append(names, im.name)
	}
	vals := func(ng, ns int) [][]float64 {
		out := make([][]float64, ng)
		for g := range out {
			for s := range ns {
				// Long and short labels side by side: 123k, 8,558, 39.3, 0.42.
				v := []float64{123456, 8558, 39.3, 0.42, 1.5e6, 0, 999, math.NaN()}[(g+s)%8]
				out[g] = append(out[g], v)
			}
		}
		return out
	}
	for _, tc := range []struct {
		groups, series int
		width          float64
	}{
		{3, len(names), 372}, {3, len(names), 120}, {1, 2, 372}, {6, len(names), 900}, {40, 1, 800}, {2, 3, 60},
	} {
		name := fmt.Sprintf("%d groups of %d bars in %.0f px", tc.groups, tc.series, tc.width)
		bs := &bars{groups: make([]string, tc.groups), series: names[:min(tc.series, len(names))], vals: vals(tc.groups, tc.series), labels: true}
		if tc.series > len(names) {
			t.Fatal("more series than implementations")
		}
		left, right, top, bottom := 70.0, 70+tc.width, 30.0, 230.0
		var ys []float64
		for _, g := range bs.vals {
			ys = append(ys, g...)
		}
		sy := newScale(axis{zero: true}, append(ys, 0), bottom, top+bs.labelRoom(left, right))
		var boxes []labelBox
		drawn := 0
		bs.layout(sy, left, right, func(g, s int, x, bw, y, y0 float64, lab labelBox, ok bool) {
			drawn++
			if !ok {
				if bw > labelFont+1 {
					t.Errorf("%s: the bar of %v, %.1f px wide, has no label", name, bs.vals[g][s], bw)
				}
				return
			}
			if lab.x0 < x || lab.x1 > x+bw {
				t.Errorf("%s: label %q (%.1f–%.1f) outside its bar's column (%.1f–%.1f)", name, lab.text, lab.x0, lab.x1, x, x+bw)
			}
			if lab.y0 < top-0.01 || lab.y1 > bottom {
				t.Errorf("%s: label %q (y %.1f–%.1f) outside the plot (y %.1f–%.1f)", name, lab.text, lab.y0, lab.y1, top, bottom)
			}
			boxes = append(boxes, lab)
		})
		if drawn == 0 {
			t.Errorf("%s: no bar drawn", name)
		}
		for i, a := range boxes {
			for _, b := range boxes[i+1:] {
				if a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1 {
					t.Errorf("%s: labels %q %v and %q %v overlap", name, a.text, a, b.text, b)
				}
			}
		}
		fig := &figure{name: "t", title: name, legend: names, panelW: int(tc.width) + padL + padR, panels: []*panel{{title: name, y: axis{zero: true}, bars: bs}}}
		if svg := string(fig.svg()); strings.Count(svg, "<text") < len(boxes) {
			t.Errorf("%s: the figure draws fewer texts than labels", name)
		}
	}
}
