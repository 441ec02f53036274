package main

// Hand-written SVG charts: the figures beside the tables. A figure is a
// title, a legend and a grid of panels; a panel has two axes (linear or
// log) and lines, or bars. Every series has one style of its own, the same
// in every figure (implStyle, palette.go).

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

type figure struct {
	name     string // file name, without .svg
	title    string
	subtitle string // under the title; wrapped to the figure's width
	cols     int    // panels per row; 0 for 1
	panelW   int    // 0 for 420
	panelH   int    // 0 for 260
	legend   []string
	panels   []*panel
}

type panel struct {
	title  string
	x, y   axis
	lines  []series
	bars   *bars
	vlines []marker // vertical reference lines at x
	hlines []marker // horizontal reference lines at y
	empty  string   // drawn instead of the plot when there is nothing to draw
}

type axis struct {
	label string
	log   bool
	// min, max: the range; both 0 to take it from the data.
	min, max float64
	// zero makes a linear range start at 0.
	zero bool
	// format writes a tick label; nil for plain numbers.
	format func(float64) string
}

type series struct {
	name string // implementation: sets the style, unless style is set
	st   *style
	pts  []pt
	step bool // a staircase (a CDF, a count over time): across, then up
	dots bool // a dot at each point
}

type pt struct{ x, y float64 }

type marker struct {
	at    float64
	label string
}

// bars are bar groups along x: groups[g] holds one bar per series (the
// implementations, in colour); values NaN are not drawn.
type bars struct {
	groups []string // labels under the groups; "" for none
	series []string
	vals   [][]float64 // [group][series]
	labels bool        // the value above each bar, in the axis's unit
	// zeroMark marks the bars of value 0 with a red tick under the axis
	// (a starved process).
	zeroMark bool
}

func (s series) style() style {
	if s.st != nil {
		return *s.st
	}
	return implStyle(s.name)
}

// Layout, in pixels.
const (
	padL, padR, padT, padB = 70, 18, 30, 48 // a panel's plot area within it
	figMargin              = 14
)

type svgBuf struct{ strings.Builder }

func (b *svgBuf) f(format string, args ...any) { fmt.Fprintf(b, format, args...) }

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;")
	return r.Replace(s)
}

// wrap splits s into lines of at most n characters, at spaces.
func wrap(s string, n int) []string {
	var out []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len([]rune(line))+1+len([]rune(w)) > n {
			out = append(out, line)
			line = w
			continue
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		out = append(out, line)
	}
	return out
}

// svg renders the figure.
func (fg *figure) svg() []byte {
	cols := max(fg.cols, 1)
	pw, ph := fg.panelW, fg.panelH
	if pw == 0 {
		pw = 420
	}
	if ph == 0 {
		ph = 260
	}
	rows := (len(fg.panels) + cols - 1) / cols
	w := figMargin*2 + cols*pw
	sub := wrap(fg.subtitle, (w-2*figMargin)*10/72) // about 7.2 pixels a character
	// The legend: entries laid left to right, wrapping.
	type entry struct {
		x, y int
		name string
	}
	var entries []entry
	lx, ly := figMargin, 0
	for _, n := range fg.legend {
		ew := 34 + int(float64(len([]rune(n)))*6.6) + 18
		if lx+ew > w-figMargin && lx > figMargin {
			lx, ly = figMargin, ly+18
		}
		entries = append(entries, entry{lx, ly, n})
		lx += ew
	}
	top := 30 + 16*len(sub) + 8
	legendTop := top
	if len(entries) > 0 {
		top += ly + 18 + 8
	}
	h := top + rows*ph + figMargin
	var b svgBuf
	b.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n", w, h, w, h)
	b.f("<title>%s</title>\n", esc(fg.title))
	b.f(`<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w, h)
	b.f(`<text x="%d" y="22" font-size="16" font-weight="bold">%s</text>`+"\n", figMargin, esc(fg.title))
	for i, l := range sub {
		b.f(`<text x="%d" y="%d" fill="#444444">%s</text>`+"\n", figMargin, 30+16*(i+1)-4, esc(l))
	}
	for _, e := range entries {
		st := implStyle(e.name)
		y := legendTop + e.y + 9
		b.f(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>`, e.x, y, e.x+28, y, st.color, dashAttr(st))
		b.f(`<text x="%d" y="%d">%s</text>`+"\n", e.x+34, y+4, esc(e.name))
	}
	for i, p := range fg.panels {
		x0 := figMargin + (i%cols)*pw
		y0 := top + (i/cols)*ph
		p.draw(&b, x0, y0, pw, ph)
	}
	b.f("</svg>\n")
	return []byte(b.String())
}

func dashAttr(st style) string {
	if st.dash != "" {
		return ` stroke-dasharray="` + st.dash + `"`
	}
	return ""
}

// scale maps data to pixels along one axis.
type scale struct {
	a       axis
	lo, hi  float64 // data range (for log: the values, > 0)
	p0, p1  float64 // pixel range
	ok      bool
	ticks   []float64
	minor   []float64 // log axes: 2 and 5 of each decade, unlabelled
	showMin bool      // log axes over few decades label 2 and 5 too
}

func (s *scale) px(v float64) float64 {
	if s.a.log {
		v = math.Log10(max(v, s.lo))
		lo, hi := math.Log10(s.lo), math.Log10(s.hi)
		return s.p0 + (v-lo)/(hi-lo)*(s.p1-s.p0)
	}
	return s.p0 + (v-s.lo)/(s.hi-s.lo)*(s.p1-s.p0)
}

// newScale fits a over the values vs (NaN and, on a log axis, those ≤ 0
// left out).
func newScale(a axis, vs []float64, p0, p1 float64) *scale {
	s := &scale{a: a, p0: p0, p1: p1}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) || (a.log && v <= 0) {
			continue
		}
		lo, hi = min(lo, v), max(hi, v)
	}
	if a.min != 0 || a.max != 0 {
		lo, hi = a.min, a.max
	}
	if math.IsInf(lo, 1) {
		return s
	}
	s.ok = true
	if a.log {
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		s.lo, s.hi = math.Pow(10, dlo), math.Pow(10, dhi)
		for d := dlo; d <= dhi; d++ {
			s.ticks = append(s.ticks, math.Pow(10, d))
			if d < dhi {
				s.minor = append(s.minor, 2*math.Pow(10, d), 5*math.Pow(10, d))
			}
		}
		s.showMin = dhi-dlo <= 2
		return s
	}
	if a.zero {
		lo = min(lo, 0)
		hi = max(hi, 0)
	}
	if hi == lo {
		hi = lo + 1
	}
	step := niceStep((hi - lo) / 5)
	s.lo = math.Floor(lo/step) * step
	s.hi = math.Ceil(hi/step) * step
	if hi > s.hi-step*0.02 && a.max == 0 { // room above the top value
		s.hi += step
	}
	for v := s.lo; v <= s.hi+step/2; v += step {
		s.ticks = append(s.ticks, math.Round(v/step)*step)
	}
	return s
}

// niceStep rounds x up to 1, 2 or 5 × a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func (s *scale) label(v float64) string {
	if s.a.format != nil {
		return s.a.format(v)
	}
	return num(v)
}

// num writes a number plainly: 1,000; 2.5; 0.25.
func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return thousands(int64(v))
	}
	if math.Abs(v) >= 100 {
		return thousands(int64(math.Round(v)))
	}
	if math.Abs(v) >= 10 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []string
	for len(s) > 3 {
		out = append([]string{s[len(s)-3:]}, out...)
		s = s[:len(s)-3]
	}
	out = append([]string{s}, out...)
	r := strings.Join(out, ",")
	if neg {
		r = "-" + r
	}
	return r
}

// durUS writes a tick in microseconds as µs, ms or s.
func durUS(v float64) string {
	switch {
	case v >= 1e6:
		return num(v/1e6) + " s"
	case v >= 1e3:
		return num(v/1e3) + " ms"
	}
	return num(v) + " µs"
}

// bytesFmt writes a byte count as B, KB or MB (1,000s).
func bytesFmt(v float64) string {
	switch {
	case math.Abs(v) >= 1e6:
		return num(math.Round(v/1e5)/10) + " MB"
	case math.Abs(v) >= 1e3:
		return num(math.Round(v/1e2)/10) + " KB"
	}
	return num(math.Round(v)) + " B"
}

func (p *panel) draw(b *svgBuf, x0, y0, w, h int) {
	left, right := float64(x0+padL), float64(x0+w-padR)
	top, bottom := float64(y0+padT), float64(y0+h-padB)
	b.f(`<text x="%.1f" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", left, y0+18, esc(p.title))
	if p.empty != "" {
		b.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f6f6f6" stroke="#cccccc"/>`, left, top, right-left, bottom-top)
		for i, l := range wrap(p.empty, int((right-left)/6.5)) {
			b.f(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#666666">%s</text>`+"\n", (left+right)/2, (top+bottom)/2+float64(i*15), esc(l))
		}
		return
	}
	var xs, ys []float64
	for _, s := range p.lines {
		for _, q := range s.pts {
			xs, ys = append(xs, q.x), append(ys, q.y)
		}
	}
	for _, m := range p.vlines {
		xs = append(xs, m.at)
	}
	for _, m := range p.hlines {
		ys = append(ys, m.at)
	}
	if p.bars != nil {
		for _, g := range p.bars.vals {
			ys = append(ys, g...)
		}
		ys = append(ys, 0)
	}
	var sx *scale
	if p.bars == nil {
		sx = newScale(p.x, xs, left, right)
	}
	ytop := top
	if p.bars != nil {
		ytop += p.bars.labelRoom(left, right) // the tallest bar's label stays in the plot
	}
	sy := newScale(p.y, ys, bottom, ytop)
	if (sx != nil && !sx.ok) || !sy.ok {
		b.f(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#666666">no data</text>`+"\n", (left+right)/2, (top+bottom)/2)
		return
	}
	// Grid and y ticks.
	for _, v := range sy.minor {
		y := sy.px(v)
		b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f0f0f0"/>`+"\n", left, y, right, y)
		if sy.showMin {
			b.f(`<text x="%.1f" y="%.1f" text-anchor="end" fill="#888888" font-size="10">%s</text>`+"\n", left-6, y+3, esc(sy.label(v)))
		}
	}
	for _, v := range sy.ticks {
		y := sy.px(v)
		b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`, left, y, right, y)
		b.f(`<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, esc(sy.label(v)))
	}
	if sx != nil {
		for _, v := range sx.minor {
			x := sx.px(v)
			b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f0f0f0"/>`+"\n", x, top, x, bottom)
			if sx.showMin {
				b.f(`<text x="%.1f" y="%.1f" text-anchor="middle" fill="#888888" font-size="10">%s</text>`+"\n", x, bottom+15, esc(sx.label(v)))
			}
		}
		for _, v := range sx.ticks {
			x := sx.px(v)
			b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`, x, top, x, bottom)
			b.f(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, bottom+15, esc(sx.label(v)))
		}
	}
	// Axes and their labels.
	b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333333"/>`, left, bottom, right, bottom)
	b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333333"/>`+"\n", left, top, left, bottom)
	xl := p.x.label
	if p.x.log {
		xl += " (log scale)"
	}
	yl := p.y.label
	if p.y.log {
		yl += " (log scale)"
	}
	b.f(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", (left+right)/2, bottom+34, esc(xl))
	b.f(`<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(x0+14), (top+bottom)/2, esc(yl))
	if p.bars != nil {
		p.drawBars(b, sy, left, right, bottom)
	}
	for _, m := range p.hlines {
		y := sy.px(m.at)
		b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333333" stroke-dasharray="2 3"/>`, left, y, right, y)
		b.f(`<text x="%.1f" y="%.1f" text-anchor="end" fill="#333333" font-size="11" paint-order="stroke" stroke="#ffffff" stroke-width="3">%s</text>`+"\n", right-2, y-4, esc(m.label))
	}
	for i, m := range p.vlines {
		x := sx.px(m.at)
		b.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333333" stroke-dasharray="2 3"/>`, x, top, x, bottom)
		// A label reads away from the plot's nearer edge, on a white halo
		// so that the curves it crosses do not hide it.
		tx, anchor := x+3, "start"
		if x > (left+right)/2 {
			tx, anchor = x-3, "end"
		}
		b.f(`<text x="%.1f" y="%.1f" text-anchor="%s" fill="#333333" font-size="11" paint-order="stroke" stroke="#ffffff" stroke-width="3">%s</text>`+"\n", tx, top+12+float64(14*i), anchor, esc(m.label))
	}
	b.f("<g>")
	for _, s := range p.lines {
		if len(s.pts) == 0 {
			continue
		}
		st := s.style()
		var d strings.Builder
		for i, q := range s.pts {
			x, y := sx.px(q.x), sy.px(q.y)
			switch {
			case i == 0:
				fmt.Fprintf(&d, "M%.1f %.1f", x, y)
			case s.step:
				fmt.Fprintf(&d, "H%.1fV%.1f", x, y)
			default:
				fmt.Fprintf(&d, "L%.1f %.1f", x, y)
			}
		}
		b.f(`<path d="%s" fill="none" stroke="%s" stroke-width="2"%s><title>%s</title></path>`+"\n", d.String(), st.color, dashAttr(st), esc(s.name))
		if s.dots {
			for _, q := range s.pts {
				b.f(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`, sx.px(q.x), sy.px(q.y), st.color)
			}
			b.f("\n")
		}
	}
	b.f("</g>\n")
}

// barWidth is the width of each bar of bs between left and right: the
// groups share the width, and a group's bars 80% of its share (90% for
// many groups of one bar).
func (bs *bars) barWidth(left, right float64) (gw, inner, bw float64) {
	ng, ns := len(bs.groups), len(bs.series)
	gw = (right - left) / float64(ng)
	inner = gw * 0.8
	if ns == 1 && ng > 20 {
		inner = gw * 0.9
	}
	return gw, inner, inner / float64(ns)
}

// Bar labels are 10 px text, at about labelCharW a character (DejaVu
// Sans's digits are 0.64 em).
const (
	labelFont  = 10.0
	labelCharW = 6.4
	labelGap   = 3.0 // between a bar's top and its label
)

// labelBox is where a bar's value is written: the box its text fills.
type labelBox struct {
	x0, y0, x1, y1 float64
	text           string
	vertical       bool // reading upwards
}

// barLabel places the label text of the bar at x, bw wide, whose top is
// at y: across, above the bar, when the text fits in the bar's width;
// else upwards, above the bar, when the bar is wider than a line of text;
// else nowhere (the value is in the table, and in the bar's tooltip). A
// label is thus always within its own bar's column, so labels cannot
// overlap one another.
func barLabel(text string, x, bw, y float64) (labelBox, bool) {
	tw := float64(len([]rune(text))) * labelCharW
	mid := x + bw/2
	switch {
	case tw <= bw-1:
		return labelBox{mid - tw/2, y - labelGap - labelFont, mid + tw/2, y - labelGap, text, false}, true
	case labelFont <= bw-1:
		return labelBox{mid - labelFont/2, y - labelGap - tw, mid + labelFont/2, y - labelGap, text, true}, true
	}
	return labelBox{}, false
}

// labelRoom is the height above the tallest bar that bs's labels need,
// between left and right.
func (bs *bars) labelRoom(left, right float64) float64 {
	if !bs.labels || len(bs.groups) == 0 || len(bs.series) == 0 {
		return 0
	}
	_, _, bw := bs.barWidth(left, right)
	room := 0.0
	for _, g := range bs.vals {
		for _, v := range g {
			if math.IsNaN(v) {
				continue
			}
			if b, ok := barLabel(compact(v), 0, bw, 0); ok {
				room = max(room, -b.y0)
			}
		}
	}
	return room
}

// layout calls each with, for each group and series, the bar's left edge, width
// and top, the axis's y, and its label's box (labOK false for none), as drawBars draws
// them.
func (bs *bars) layout(sy *scale, left, right float64, each func(g, s int, x, bw, y, y0 float64, lab labelBox, labOK bool)) {
	ng, ns := len(bs.groups), len(bs.series)
	if ng == 0 || ns == 0 {
		return
	}
	gw, inner, bw := bs.barWidth(left, right)
	y0 := sy.px(max(0, sy.lo))
	for g := range ng {
		gx := left + gw*float64(g) + (gw-inner)/2
		for s := range ns {
			v := bs.vals[g][s]
			if math.IsNaN(v) {
				continue
			}
			x := gx + bw*float64(s)
			y := sy.px(v)
			var lab labelBox
			ok := false
			if bs.labels {
				lab, ok = barLabel(compact(v), x, bw, min(y, y0))
			}
			each(g, s, x, bw, y, y0, lab, ok)
		}
	}
}

func (p *panel) drawBars(b *svgBuf, sy *scale, left, right, bottom float64) {
	bs := p.bars
	if len(bs.groups) == 0 || len(bs.series) == 0 {
		return
	}
	bs.layout(sy, left, right, func(g, s int, x, bw, y, y0 float64, lab labelBox, labOK bool) {
		v := bs.vals[g][s]
		st := implStyle(bs.series[s])
		op := ""
		if st.dash != "" {
			op = ` fill-opacity="0.6"`
		}
		b.f(`<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"%s><title>%s: %s</title></rect>`, x, min(y, y0), max(bw-0.5, 0.5), math.Abs(y0-y), st.color, op, esc(bs.series[s]+" "+bs.groups[g]), esc(num(v)))
		if bs.zeroMark && v == 0 {
			b.f(`<line x1="%.2f" y1="%.1f" x2="%.2f" y2="%.1f" stroke="#D00000" stroke-width="%.1f"/>`, x+bw/2, y0+1, x+bw/2, y0+6, min(max(1.5, bw*0.6), 6))
		}
		switch {
		case !labOK:
		case lab.vertical:
			// Rotated about its anchor: the text runs up from the box's
			// bottom, its baseline on the box's right.
			ax, ay := lab.x1-1.5, lab.y1
			b.f(`<text x="%.2f" y="%.2f" font-size="%g" transform="rotate(-90 %.2f %.2f)">%s</text>`, ax, ay, labelFont, ax, ay, esc(lab.text))
		default:
			b.f(`<text x="%.2f" y="%.2f" text-anchor="middle" font-size="%g">%s</text>`, (lab.x0+lab.x1)/2, lab.y1, labelFont, esc(lab.text))
		}
	})
	gw, _, _ := bs.barWidth(left, right)
	for g, name := range bs.groups {
		if name != "" {
			b.f(`<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, left+gw*(float64(g)+0.5), bottom+15, esc(name))
		}
	}
	b.f("\n")
}

// cdf is the empirical distribution of ds (in µs) as at most 300 points:
// x the latency, y the share of samples at or below it.
func cdf(name string, ds []float64) series {
	s := slices.Clone(ds)
	slices.Sort(s)
	out := series{name: name, step: true}
	n := len(s)
	if n == 0 {
		return out
	}
	const most = 300
	out.pts = append(out.pts, pt{s[0], 0})
	for k := 1; k <= most; k++ {
		i := int(math.Ceil(float64(k)*float64(n)/most)) - 1
		i = min(max(i, 0), n-1)
		q := pt{s[i], float64(i+1) / float64(n)}
		if last := out.pts[len(out.pts)-1]; last == q {
			continue
		}
		out.pts = append(out.pts, q)
	}
	return out
}

// writeFigures writes every table's figures into dir as NAME.svg.
func writeFigures(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, t := range rep.Scenarios {
		for _, fg := range t.figs {
			if err := os.WriteFile(filepath.Join(dir, fg.name+".svg"), fg.svg(), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// compact writes a bar's value in at most about five characters: 8,558;
// 39.3; 0.42; 123k. The axis names the unit.
func compact(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case a >= 1e5:
		return strconv.FormatFloat(v/1e3, 'f', 0, 64) + "k"
	case a >= 100:
		return thousands(int64(math.Round(v)))
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a == 0:
		return "0"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
