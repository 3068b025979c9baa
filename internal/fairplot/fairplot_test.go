package fairplot

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testChart(windows bool) *Chart {
	c := &Chart{Title: "two teams", XLabel: "hour", X: []float64{1, 2, 3, 4}, Capacity: 8,
		Queues: []Queue{
			{Name: "team-a", Allocated: []float64{4, 8, 2, 0}, FairShare: []float64{4, 6, 4, 4}, Quota: []float64{2, 2, 4, 4}},
			{Name: "team-b", Allocated: []float64{4, 0, 6, 8}, FairShare: []float64{4, 2, 4, 4}},
		}}
	if windows {
		c.Windows = []Window{{Queue: "team-a", From: 3, To: 4}}
	}
	return c
}

// svgText is every text element of an SVG, and how many elements of each
// name it has.
func svgText(t *testing.T, b []byte) (string, map[string]int) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var text strings.Builder
	count := map[string]int{}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed SVG: %v", err)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			count[tk.Name.Local]++
		case xml.CharData:
			text.Write(tk)
			text.WriteByte(' ')
		}
	}
	return text.String(), count
}

// TestSVG: the picture is well-formed SVG with the title, every queue and
// the legend's words, the same bytes every time, and a shaded window only
// when the chart has one.
func TestSVG(t *testing.T) {
	render := func(c *Chart) []byte {
		var b bytes.Buffer
		if err := c.Write(&b, "svg"); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	with, again, without := render(testChart(true)), render(testChart(true)), render(testChart(false))
	if !bytes.Equal(with, again) {
		t.Error("two renderings of one chart differ")
	}
	text, count := svgText(t, with)
	for _, want := range []string{"two teams", "team-a", "team-b", "allocated", "fair share", "quota", "capacity", "schedule window"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the SVG's text: %s", want, text)
		}
	}
	if count["path"] < 10 {
		t.Errorf("%d paths, want the areas and lines of 3 panels", count["path"])
	}
	// team-b has no quota and no window: "quota" and "schedule window"
	// appear once each (team-a's legend).
	for _, w := range []string{"quota", "schedule window"} {
		if n := strings.Count(text, w); n != 1 {
			t.Errorf("%q in %d legends, want 1 (team-a only)", w, n)
		}
	}
	// windowColor, as vgsvg writes fills.
	const shade = "fill:#E1E1E1"
	if !bytes.Contains(with, []byte(shade)) {
		t.Errorf("no shaded window (%s) in the SVG", shade)
	}
	if bytes.Contains(without, []byte(shade)) || strings.Contains(string(without), "schedule window") {
		t.Error("a window is shaded in a chart without windows")
	}
}

func TestPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.png")
	if err := Save(testChart(true), path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 960 || b.Dy() != 691 {
		t.Errorf("PNG of %v, want 960×691 (10 in × 4 rows of 1.8 in at 96 dpi)", b)
	}
}

func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Chart)
		want string
	}{
		{"one sample", func(c *Chart) { c.X = c.X[:1] }, "at least 2"},
		{"not ascending", func(c *Chart) { c.X[2] = 1 }, "not ascending at 2"},
		{"no queues", func(c *Chart) { c.Queues = nil }, "0 queues"},
		{"short series", func(c *Chart) { c.Queues[1].FairShare = c.Queues[1].FairShare[:2] }, "queue team-b: 2 fair share values for 4 samples"},
		{"no allocation", func(c *Chart) { c.Queues[0].Allocated = nil }, "queue team-a: no allocation"},
	} {
		c := testChart(false)
		tc.edit(c)
		if err := c.Write(io.Discard, "svg"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := Save(testChart(false), filepath.Join(t.TempDir(), "out.pdf")); err == nil || !strings.Contains(err.Error(), ".svg or .png") {
		t.Errorf("a .pdf: %v", err)
	}
}
