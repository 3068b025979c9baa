// Package quotaschedule reads and evaluates the time windows of a queue's
// quota schedule (DESIGN.md, "Quota schedules"): days of the week, a start
// and an end in hours and minutes, in an IANA time zone. It is pure (no
// clock of its own, no Kubernetes): tessera-sim's scenario loader and the
// controller's Queue translation both use it, so a file and a cluster read a
// window the same way.
//
// The rule, as the zone's wall clock says: a window holds at an instant when
// the zone's wall clock then reads a time from its start (inclusive) to its
// end (exclusive) on one of its days — for a window that crosses midnight
// (end at or before start), from start on one of its days to end on the next
// day. So on a spring-forward day a window inside the skipped hour (02:00 to
// 03:00 in New York) does not hold at all, and one that begins inside it
// holds from the jump (03:00); on a fall-back day a window inside the
// repeated hour holds twice (the wall clock reads those times twice).
package quotaschedule

import (
	"archive/zip"
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// TZRelease is the IANA Time Zone Database release in tzdb/zoneinfo.zip.
const TZRelease = "2025c"

// tzZip is the pinned zone database (tzdb/README.md). Zones come from it
// alone, never from the machine's files or ZONEINFO, so a window switches at
// the same instant on every machine, whatever its tzdata release.
//
//go:embed tzdb/zoneinfo.zip
var tzZip []byte

// Spec is a window as written: in a scenario file or a Queue's spec.
type Spec struct {
	// Days are English day names, three letters at least ("Mon",
	// "tuesday"), or ranges of them ("Mon-Fri", "Fri-Mon" wraps); none
	// means every day.
	Days []string
	// Start and End are wall-clock times "HH:MM" (00:00 to 23:59; End may
	// be 24:00). End at or before Start crosses midnight; equal is refused.
	Start, End string
	// TimeZone is an IANA zone name ("Europe/Berlin"); "" is UTC.
	TimeZone string
}

// Window is a parsed Spec.
type Window struct {
	// days[d] for time.Weekday d: the window starts on that day.
	days [7]bool
	// start and end are minutes from midnight, end up to 1440.
	start, end int
	loc        *time.Location
}

var dayNames = []string{"sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"}

// parseDay reads one day name: three letters at least of its English name,
// any case.
func parseDay(s string) (time.Weekday, error) {
	l := strings.ToLower(strings.TrimSpace(s))
	if len(l) >= 3 {
		for d, n := range dayNames {
			if strings.HasPrefix(n, l) {
				return time.Weekday(d), nil
			}
		}
	}
	return 0, fmt.Errorf("day %q: want a day of the week (Mon, Tue, … or a range like Mon-Fri)", s)
}

// parseClock reads "HH:MM"; 24:00 only when end is true.
func parseClock(s string, end bool) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	bad := fmt.Errorf("%q: want a time HH:MM from 00:00 to 23:59", s)
	if end {
		bad = fmt.Errorf("%q: want a time HH:MM from 00:00 to 24:00", s)
	}
	if !ok || len(h) != 2 || len(m) != 2 {
		return 0, bad
	}
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if err1 != nil || err2 != nil || hh < 0 || mm < 0 || mm > 59 || h[0] == '+' || m[0] == '+' {
		return 0, bad
	}
	switch {
	case hh < 24:
		return hh*60 + mm, nil
	case hh == 24 && mm == 0 && end:
		return 1440, nil
	}
	return 0, bad
}

// Parse reads a Spec; the error names the field that is wrong.
func Parse(s Spec) (Window, error) {
	var w Window
	if len(s.Days) == 0 {
		w.days = [7]bool{true, true, true, true, true, true, true}
	}
	for _, d := range s.Days {
		from, to, isRange := strings.Cut(d, "-")
		a, err := parseDay(from)
		if err != nil {
			return Window{}, fmt.Errorf("days: %w", err)
		}
		b := a
		if isRange {
			if b, err = parseDay(to); err != nil {
				return Window{}, fmt.Errorf("days: %w", err)
			}
		}
		for i := a; ; i = (i + 1) % 7 {
			w.days[i] = true
			if i == b {
				break
			}
		}
	}
	var err error
	if w.start, err = parseClock(s.Start, false); err != nil {
		return Window{}, fmt.Errorf("start: %w", err)
	}
	if w.end, err = parseClock(s.End, true); err != nil {
		return Window{}, fmt.Errorf("end: %w", err)
	}
	if w.start == w.end {
		return Window{}, fmt.Errorf("end: %s is the start: a window needs a length (00:00 to 24:00 is a whole day)", s.End)
	}
	if w.loc, err = loadZone(s.TimeZone); err != nil {
		return Window{}, fmt.Errorf("timeZone: %w", err)
	}
	return w, nil
}

// loadZone reads an IANA zone name. time.LoadLocation also reads paths and
// "Local"; a schedule must not depend on the machine's own zone or files.
func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if name == "Local" || strings.HasPrefix(name, "/") || strings.Contains(name, "..") || strings.ContainsAny(name, "\\\x00") {
		return nil, fmt.Errorf("%q is not an IANA time zone name (like Europe/Berlin)", name)
	}
	if loc, ok := zones.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := zoneFromDB(name)
	if err != nil {
		return nil, err
	}
	zones.Store(name, loc)
	return loc, nil
}

// zoneFromDB reads a zone from the pinned database (tzZip).
func zoneFromDB(name string) (*time.Location, error) {
	zr, err := zip.NewReader(bytes.NewReader(tzZip), int64(len(tzZip)))
	if err != nil {
		return nil, fmt.Errorf("reading the embedded zone database: %w", err)
	}
	for _, f := range zr.File {
		if f.Name != name {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return nil, fmt.Errorf("zone %q in the embedded database: %w", name, err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("zone %q in the embedded database: %w", name, err)
		}
		loc, err := time.LoadLocationFromTZData(name, data)
		if err != nil {
			return nil, fmt.Errorf("zone %q in the embedded database: %w", name, err)
		}
		return loc, nil
	}
	return nil, fmt.Errorf("%q is not an IANA time zone name (like Europe/Berlin) in tz release %s", name, TZRelease)
}

// zones caches the zones read: the controller parses each Queue's windows
// every cycle, and reading a zone scans the database each time. Only
// names that loaded are kept, so its size is bounded by the database.
var zones sync.Map

// crosses says whether the window runs past midnight into the next day.
func (w Window) crosses() bool { return w.end <= w.start }

// Holds says whether the window holds at t: the zone's wall clock then reads
// a time inside it (see the package comment).
func (w Window) Holds(t time.Time) bool {
	l := t.In(w.loc)
	c := l.Hour()*60 + l.Minute()
	d := l.Weekday()
	if !w.crosses() {
		return w.days[d] && c >= w.start && c < w.end
	}
	return w.days[d] && c >= w.start || w.days[(d+6)%7] && c < w.end
}

// horizon is how far Next looks: a week repeats, so a window that changes at
// all changes within eight days (the extra day for one crossing midnight,
// and for a zone transition moving the wall clock).
const horizon = 9 * 24 * time.Hour

// Next is the first instant after t at which Holds changes, or the zero
// time when it never does (a window of every day, all day). Between the
// instants the wall clock reads the window's start or end and the zone's
// transitions, Holds cannot change: so Next tries those, in order.
func (w Window) Next(t time.Time) time.Time {
	now := w.Holds(t)
	for _, c := range w.candidates(t) {
		if w.Holds(c) != now {
			return c
		}
	}
	return time.Time{}
}

// candidates are the instants in (t, t+horizon] at which the wall clock
// reads the window's start or end, or the zone's offset changes, sorted. Per
// stretch of constant offset, the wall clock is the instant plus the offset,
// so a wall time maps to an instant by subtracting it — twice on a
// fall-back day, not at all inside a spring-forward gap.
func (w Window) candidates(t time.Time) []time.Time {
	var out []time.Time
	for seg := t; seg.Before(t.Add(horizon)); {
		_, off := seg.In(w.loc).Zone()
		_, end := seg.In(w.loc).ZoneBounds()
		if end.IsZero() || end.After(t.Add(horizon)) {
			end = t.Add(horizon)
		}
		l := seg.In(w.loc)
		day := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, time.UTC)
		for k := -1; k <= 10; k++ {
			for _, m := range []int{w.start, w.end} {
				wall := day.AddDate(0, 0, k).Add(time.Duration(m) * time.Minute)
				in := wall.Add(-time.Duration(off) * time.Second)
				if in.After(t) && !in.Before(seg) && in.Before(end) {
					out = append(out, in)
				}
			}
		}
		if end.After(t) && end.Before(t.Add(horizon)) {
			out = append(out, end)
		}
		seg = end
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return slices.CompactFunc(out, func(a, b time.Time) bool { return a.Equal(b) })
}

// Schedule is a queue's windows in order: the first that holds wins.
type Schedule []Window

// Active is the index of the first window that holds at t, or -1.
func (s Schedule) Active(t time.Time) int {
	for i, w := range s {
		if w.Holds(t) {
			return i
		}
	}
	return -1
}

// Next is the first instant after t at which any window starts or stops
// holding (Active may change then), or the zero time when none ever does.
func (s Schedule) Next(t time.Time) time.Time {
	var next time.Time
	for _, w := range s {
		if n := w.Next(t); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	return next
}
