package quotaschedule

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWindowAcrossDST pins the wall-clock rule on the days clocks change, in
// New York (2026: forward 8 March 02:00, back 1 November 02:00) and Berlin
// (forward 29 March 02:00, back 25 October 03:00).
func TestWindowAcrossDST(t *testing.T) {
	ny, berlin := "America/New_York", "Europe/Berlin"
	tests := []struct {
		name  string
		spec  Spec
		at    string
		holds bool
		next  string // "" for never
	}{
		{"business hours, before", Spec{[]string{"Mon-Fri"}, "09:00", "17:00", ny}, "2026-03-09T08:59:00-04:00", false, "2026-03-09T09:00:00-04:00"},
		{"business hours, inside", Spec{[]string{"Mon-Fri"}, "09:00", "17:00", ny}, "2026-03-09T16:59:59-04:00", true, "2026-03-09T17:00:00-04:00"},
		{"friday evening to monday across spring-forward", Spec{[]string{"Mon-Fri"}, "09:00", "17:00", ny}, "2026-03-06T17:00:00-05:00", false, "2026-03-09T09:00:00-04:00"},
		{"friday evening to monday across fall-back", Spec{[]string{"Mon-Fri"}, "09:00", "17:00", ny}, "2026-10-30T18:00:00-04:00", false, "2026-11-02T09:00:00-05:00"},
		{"inside the skipped hour: not that day", Spec{nil, "02:00", "03:00", ny}, "2026-03-08T01:59:00-05:00", false, "2026-03-09T02:00:00-04:00"},
		{"starts inside the skipped hour: from the jump", Spec{nil, "02:30", "04:00", ny}, "2026-03-08T01:00:00-05:00", false, "2026-03-08T03:00:00-04:00"},
		{"starts inside the skipped hour: then holds", Spec{nil, "02:30", "04:00", ny}, "2026-03-08T03:00:00-04:00", true, "2026-03-08T04:00:00-04:00"},
		{"repeated hour: first time", Spec{nil, "01:00", "01:30", ny}, "2026-11-01T00:59:00-04:00", false, "2026-11-01T01:00:00-04:00"},
		{"repeated hour: first time ends", Spec{nil, "01:00", "01:30", ny}, "2026-11-01T01:10:00-04:00", true, "2026-11-01T01:30:00-04:00"},
		{"repeated hour: again after the clock goes back", Spec{nil, "01:00", "01:30", ny}, "2026-11-01T01:45:00-04:00", false, "2026-11-01T01:00:00-05:00"},
		{"repeated hour: second time ends", Spec{nil, "01:00", "01:30", ny}, "2026-11-01T01:10:00-05:00", true, "2026-11-01T01:30:00-05:00"},
		{"crosses midnight over fall-back", Spec{[]string{"Fri-Sat"}, "22:00", "06:00", berlin}, "2026-10-24T23:00:00+02:00", true, "2026-10-25T06:00:00+01:00"},
		{"crosses midnight: sunday night is not listed", Spec{[]string{"Fri-Sat"}, "22:00", "06:00", berlin}, "2026-10-25T22:00:00+01:00", false, "2026-10-30T22:00:00+01:00"},
		{"crosses midnight: after a friday start", Spec{[]string{"fri"}, "22:00", "06:00", berlin}, "2026-03-28T05:59:00+01:00", true, "2026-03-28T06:00:00+01:00"},
		{"berlin skipped hour", Spec{nil, "02:00", "02:30", berlin}, "2026-03-29T01:00:00+01:00", false, "2026-03-30T02:00:00+02:00"},
		{"berlin repeated hour holds twice", Spec{nil, "02:15", "02:45", berlin}, "2026-10-25T02:50:00+02:00", false, "2026-10-25T02:15:00+01:00"},
		{"berlin evening across spring-forward", Spec{[]string{"Sun"}, "18:00", "24:00", berlin}, "2026-03-28T18:00:00+01:00", false, "2026-03-29T18:00:00+02:00"},
		{"whole day, every day", Spec{nil, "00:00", "24:00", ""}, "2026-01-01T00:00:00Z", true, ""},
		{"monday all day", Spec{[]string{"Monday"}, "00:00", "24:00", "UTC"}, "2026-01-04T23:00:00Z", false, "2026-01-05T00:00:00Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			at := mustTime(t, tc.at)
			if got := w.Holds(at); got != tc.holds {
				t.Errorf("Holds(%s) = %v, want %v", tc.at, got, tc.holds)
			}
			got := w.Next(at)
			switch {
			case tc.next == "" && !got.IsZero():
				t.Errorf("Next(%s) = %s, want never", tc.at, got)
			case tc.next != "" && !got.Equal(mustTime(t, tc.next)):
				t.Errorf("Next(%s) = %s, want %s", tc.at, got.In(w.loc).Format(time.RFC3339), tc.next)
			}
		})
	}
}

// TestNextIsFirstChange compares Next with a minute-by-minute scan for
// random windows and instants, in zones with and without daylight saving.
func TestNextIsFirstChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 22))
	zones := []string{"America/New_York", "Europe/Berlin", "UTC", "Australia/Lord_Howe", "Asia/Kolkata"}
	days := []string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
	base := mustTime(t, "2026-01-01T00:00:00Z")
	for i := 0; i < 150; i++ {
		var spec Spec
		for _, d := range days {
			if rng.IntN(3) == 0 {
				spec.Days = append(spec.Days, d)
			}
		}
		s, e := rng.IntN(48)*30, rng.IntN(49)*30
		if s == e {
			continue
		}
		spec.Start = time.Date(0, 1, 1, 0, s, 0, 0, time.UTC).Format("15:04")
		spec.End = time.Date(0, 1, 1, 0, e, 0, 0, time.UTC).Format("15:04")
		if e == 1440 {
			spec.End = "24:00"
		}
		spec.TimeZone = zones[rng.IntN(len(zones))]
		w, err := Parse(spec)
		if err != nil {
			t.Fatalf("%+v: %v", spec, err)
		}
		at := base.Add(time.Duration(rng.Int64N(365*24*60)) * time.Minute).Add(time.Duration(rng.IntN(60)) * time.Second)
		want := time.Time{}
		now := w.Holds(at)
		for m := at.Truncate(time.Minute).Add(time.Minute); m.Before(at.Add(horizon)); m = m.Add(time.Minute) {
			if w.Holds(m) != now {
				want = m
				break
			}
		}
		if got := w.Next(at); !got.Equal(want) {
			t.Errorf("%+v at %s: Next = %s, scan = %s", spec, at, got, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{[]string{"Mo"}, "09:00", "17:00", ""}, `days: day "Mo": want a day of the week`},
		{Spec{[]string{"Mon-Funday"}, "09:00", "17:00", ""}, `days: day "Funday"`},
		{Spec{nil, "9:00", "17:00", ""}, `start: "9:00": want a time HH:MM from 00:00 to 23:59`},
		{Spec{nil, "24:00", "17:00", ""}, `start: "24:00"`},
		{Spec{nil, "09:00", "24:01", ""}, `end: "24:01": want a time HH:MM from 00:00 to 24:00`},
		{Spec{nil, "09:60", "17:00", ""}, `start: "09:60"`},
		{Spec{nil, "09:00", "09:00", ""}, `end: 09:00 is the start`},
		{Spec{nil, "09:00", "17:00", "Mars/Olympus"}, `timeZone: "Mars/Olympus" is not an IANA time zone name`},
		{Spec{nil, "09:00", "17:00", "Local"}, `timeZone: "Local"`},
		{Spec{nil, "09:00", "17:00", "/etc/localtime"}, `timeZone: "/etc/localtime"`},
	}
	for _, tc := range tests {
		_, err := Parse(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%+v) = %v, want %q", tc.spec, err, tc.want)
		}
	}
}

func TestScheduleFirstWins(t *testing.T) {
	a, _ := Parse(Spec{[]string{"Mon-Fri"}, "09:00", "17:00", "UTC"})
	b, _ := Parse(Spec{nil, "12:00", "20:00", "UTC"})
	s := Schedule{a, b}
	for at, want := range map[string]int{
		"2026-01-05T10:00:00Z": 0, "2026-01-05T13:00:00Z": 0, "2026-01-05T18:00:00Z": 1,
		"2026-01-10T13:00:00Z": 1, "2026-01-10T08:00:00Z": -1,
	} {
		if got := s.Active(mustTime(t, at)); got != want {
			t.Errorf("Active(%s) = %d, want %d", at, got, want)
		}
	}
	if got, want := s.Next(mustTime(t, "2026-01-05T10:00:00Z")), mustTime(t, "2026-01-05T12:00:00Z"); !got.Equal(want) {
		t.Errorf("Next = %s, want %s", got, want)
	}
}

// FuzzParse: any input parses or errs without panicking; a window that
// parses keeps Next's promise: after t, the window changes there and not
// the second before.
func FuzzParse(f *testing.F) {
	f.Add("Mon-Fri", "09:00", "17:00", "America/New_York", int64(0))
	f.Add("sat,Sun", "22:00", "06:00", "Europe/Berlin", int64(1e9))
	f.Add("", "00:00", "24:00", "", int64(-5))
	f.Add("Fri-Mon", "02:30", "03:00", "Australia/Lord_Howe", int64(7e8))
	f.Fuzz(func(t *testing.T, days, start, end, zone string, sec int64) {
		var ds []string
		if days != "" {
			ds = strings.Split(days, ",")
		}
		w, err := Parse(Spec{ds, start, end, zone})
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(sec%(400*24*3600)) * time.Second)
		n := w.Next(at)
		if n.IsZero() {
			return
		}
		if !n.After(at) || w.Holds(n) == w.Holds(at) || w.Holds(n.Add(-time.Second)) != w.Holds(at) {
			t.Fatalf("%q %q %q %q at %s: Next %s does not change Holds", days, start, end, zone, at, n)
		}
	})
}
