// Package fairplot draws queues' GPU allocation over time with gonum/plot:
// a stacked overview of every queue against the cluster's capacity, then
// one panel per queue with its allocation (filled), fair share (line),
// quota (dashed) and the time windows a schedule held (shaded). The
// simulator (tessera-sim run --plot) and the local demo draw with it. The
// same Chart always gives the same bytes.
package fairplot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart is what is drawn. Every series has one value per entry of X.
type Chart struct {
	Title string
	// XLabel names X's unit ("hour", "second").
	XLabel string
	// X are the sample times, ascending; each value holds until the next.
	X []float64
	// Capacity is the cluster's GPUs (a line on the overview; 0: none).
	Capacity float64
	Queues   []Queue
	// Windows are the times a queue's schedule changed its settings.
	Windows []Window
}

// Queue is one queue's series, in GPUs.
type Queue struct {
	Name      string
	Allocated []float64
	FairShare []float64 // nil: not drawn
	Quota     []float64 // nil or every value ≤ 0: not drawn
}

// Window is a time a queue's schedule held (from X's From to To).
type Window struct {
	Queue    string
	From, To float64
}

// maxQueues bounds the panels of one picture.
const maxQueues = 24

// Validate says what is wrong with c.
func (c *Chart) Validate() error {
	if len(c.X) < 2 {
		return fmt.Errorf("fairplot: %d samples, at least 2 needed", len(c.X))
	}
	for i := 1; i < len(c.X); i++ {
		if !(c.X[i] > c.X[i-1]) {
			return fmt.Errorf("fairplot: sample times not ascending at %d (%v after %v)", i, c.X[i], c.X[i-1])
		}
	}
	if len(c.Queues) == 0 || len(c.Queues) > maxQueues {
		return fmt.Errorf("fairplot: %d queues, want 1 to %d", len(c.Queues), maxQueues)
	}
	for _, q := range c.Queues {
		for what, s := range map[string][]float64{"allocated": q.Allocated, "fair share": q.FairShare, "quota": q.Quota} {
			if s != nil && len(s) != len(c.X) {
				return fmt.Errorf("fairplot: queue %s: %d %s values for %d samples", q.Name, len(s), what, len(c.X))
			}
		}
		if q.Allocated == nil {
			return fmt.Errorf("fairplot: queue %s: no allocation", q.Name)
		}
	}
	return nil
}

// Save writes the picture to path, SVG or PNG by its extension.
func Save(c *Chart, path string) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	if format != "svg" && format != "png" {
		return fmt.Errorf("fairplot: %s: want a .svg or .png file", path)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := c.Write(f, format); err != nil {
		f.Close()
		return fmt.Errorf("fairplot: %s: %w", path, err)
	}
	return f.Close()
}

// Write draws the picture to w as "svg" or "png".
func (c *Chart) Write(w io.Writer, format string) error {
	if err := c.Validate(); err != nil {
		return err
	}
	width, rowH := 10*vg.Inch, 1.8*vg.Inch
	height := rowH * vg.Length(len(c.Queues)+2)
	var canvas vg.CanvasWriterTo
	switch format {
	case "svg":
		canvas = vgsvg.NewWith(vgsvg.UseWH(width, height), vgsvg.EmbedFonts(false))
	case "png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96))}
	default:
		return fmt.Errorf("fairplot: format %q: want svg or png", format)
	}
	plots, err := c.plots()
	if err != nil {
		return err
	}
	// The overview takes two rows' height: one tile of a two-row grid.
	dc := draw.New(canvas)
	top := draw.Crop(dc, 0, 0, height-2*rowH, 0)
	rest := draw.Crop(dc, 0, 0, 0, -2*rowH)
	plots[0].Draw(top)
	rows := make([][]*plot.Plot, len(plots)-1)
	for i := range rows {
		rows[i] = []*plot.Plot{plots[i+1]}
	}
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadX: vg.Millimeter, PadY: vg.Millimeter, PadTop: 2 * vg.Millimeter}
	cs := plot.Align(rows, tiles, rest)
	for i := range rows {
		rows[i][0].Draw(cs[i][0])
	}
	_, err = canvas.WriteTo(w)
	return err
}

// plots builds the overview and each queue's panel.
func (c *Chart) plots() ([]*plot.Plot, error) {
	ymax := c.Capacity
	total := make([]float64, len(c.X))
	for _, q := range c.Queues {
		for i, v := range q.Allocated {
			total[i] += v
		}
		ymax = math.Max(ymax, maxOf(q.FairShare, q.Quota))
	}
	ymax = math.Max(1, math.Max(ymax, maxOf(total)))
	over, err := c.overview(ymax * 1.05)
	if err != nil {
		return nil, err
	}
	out := []*plot.Plot{over}
	for i, q := range c.Queues {
		p, err := c.panel(i, q, ymax*1.05)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// overview stacks every queue's allocation; the first queue at the bottom.
func (c *Chart) overview(ymax float64) (*plot.Plot, error) {
	p := c.newPlot(c.Title+" — GPUs allocated, stacked by queue", ymax)
	cum := make([][]float64, len(c.Queues))
	sum := make([]float64, len(c.X))
	for i, q := range c.Queues {
		for j, v := range q.Allocated {
			sum[j] += v
		}
		cum[i] = append([]float64(nil), sum...)
	}
	// Tallest first, so each lower band paints over the one above it.
	for i := len(c.Queues) - 1; i >= 0; i-- {
		l, err := c.line(cum[i])
		if err != nil {
			return nil, err
		}
		l.FillColor = fill(i)
		l.Color = plotutil.Color(i)
		p.Add(l)
	}
	for i, q := range c.Queues {
		p.Legend.Add(q.Name, legendBox{fill(i)})
	}
	if c.Capacity > 0 {
		l, err := c.line(constant(c.Capacity, len(c.X)))
		if err != nil {
			return nil, err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("capacity", l)
	}
	return p, nil
}

// panel is one queue: windows shaded, allocation filled, fair share and
// quota as lines.
func (c *Chart) panel(i int, q Queue, ymax float64) (*plot.Plot, error) {
	p := c.newPlot(q.Name, ymax)
	shaded := false
	for _, w := range c.Windows {
		if w.Queue != q.Name {
			continue
		}
		shaded = true
		poly, err := plotter.NewPolygon(plotter.XYs{{X: w.From, Y: 0}, {X: w.To, Y: 0}, {X: w.To, Y: ymax}, {X: w.From, Y: ymax}})
		if err != nil {
			return nil, err
		}
		poly.Color = windowColor
		poly.LineStyle.Width = 0
		p.Add(poly)
	}
	alloc, err := c.line(q.Allocated)
	if err != nil {
		return nil, err
	}
	alloc.FillColor, alloc.Color = fill(i), plotutil.Color(i)
	p.Add(alloc)
	p.Legend.Add("allocated", legendBox{fill(i)})
	if q.FairShare != nil {
		l, err := c.line(q.FairShare)
		if err != nil {
			return nil, err
		}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add("fair share", l)
	}
	if q.Quota != nil && maxOf(q.Quota) > 0 {
		l, err := c.line(q.Quota)
		if err != nil {
			return nil, err
		}
		l.Color, l.Dashes = quotaColor, []vg.Length{vg.Points(5), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("quota", l)
	}
	if shaded {
		p.Legend.Add("schedule window", legendBox{windowColor})
	}
	return p, nil
}

func (c *Chart) newPlot(title string, ymax float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = "GPUs"
	p.X.Min, p.X.Max = c.X[0], c.X[len(c.X)-1]
	p.Y.Min, p.Y.Max = 0, ymax
	p.Legend.Top, p.Legend.Left = true, false
	if span := c.X[len(c.X)-1] - c.X[0]; c.XLabel == "hour" && span >= 48 {
		p.X.Tick.Marker = dayTicks{}
	}
	p.Add(plotter.NewGrid())
	return p
}

// dayTicks marks whole days on an axis of hours.
type dayTicks struct{}

func (dayTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for h := math.Ceil(lo/24) * 24; h <= hi; h += 24 {
		out = append(out, plot.Tick{Value: h, Label: strconv.FormatFloat(h, 'f', -1, 64)})
	}
	return out
}

// line is a step line of the samples (a value holds until the next).
func (c *Chart) line(v []float64) (*plotter.Line, error) {
	xy := make(plotter.XYs, len(v))
	for i := range v {
		xy[i] = plotter.XY{X: c.X[i], Y: v[i]}
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return nil, err
	}
	l.StepStyle = plotter.PostStep
	return l, nil
}

var (
	windowColor = color.NRGBA{R: 225, G: 225, B: 225, A: 255}
	quotaColor  = color.NRGBA{R: 200, G: 30, B: 30, A: 255}
)

// fill is queue i's area colour: its line colour, lighter.
func fill(i int) color.Color {
	r, g, b, _ := plotutil.Color(i).RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 170}
}

// legendBox is a legend thumbnail filled with one colour.
type legendBox struct{ c color.Color }

func (b legendBox) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y}}
	c.FillPolygon(b.c, c.ClipPolygonXY(pts))
}

func maxOf(vs ...[]float64) float64 {
	m := 0.0
	for _, v := range vs {
		for _, x := range v {
			m = math.Max(m, x)
		}
	}
	return m
}

func constant(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}
