// Package window computes failback windows: weekly ranges in a named time
// zone, one-off ranges, and blackout dates that override both. It is pure
// (the time is passed in) so daylight-saving edges and midnight crossings
// are table-tested, and the scheduler only arms a timer for the next edge.
package window

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Range is one occurrence of a window, [Start, End).
type Range struct {
	Start, End time.Time
	Name       string // the window (or windows, joined by "+") it belongs to
	Kind       string // "weekly", "once", or "merged"
}

// Weekly is a range of local clock time on some days of the week. When To
// is not after From the range ends on the next day (22:00 to 02:00).
type Weekly struct {
	Days     []time.Weekday
	From, To Clock
}

// Clock is a time of day, in minutes after local midnight.
type Clock int

// ParseClock reads "HH:MM" (24-hour).
func ParseClock(s string) (Clock, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, fmt.Errorf("time of day %q: want HH:MM", s)
	}
	return Clock(t.Hour()*60 + t.Minute()), nil
}

func (c Clock) String() string { return fmt.Sprintf("%02d:%02d", int(c)/60, int(c)%60) }

// Date is a calendar day in the window's time zone.
type Date struct {
	Year  int
	Month time.Month
	Day   int
}

// ParseDate reads "YYYY-MM-DD".
func ParseDate(s string) (Date, error) {
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return Date{}, fmt.Errorf("date %q: want YYYY-MM-DD", s)
	}
	return Date{t.Year(), t.Month(), t.Day()}, nil
}

// Window is one named failback window of a group.
type Window struct {
	Name      string
	Loc       *time.Location
	Weekly    []Weekly
	Once      []Range // absolute ranges
	Blackouts []Date  // whole local days on which no part of this window is open
}

// horizonDays bounds the search for weekly occurrences: a weekly window
// occurs within 7 days, but blackouts may remove many in a row.
const horizonDays = 400

// occurrences returns this window's ranges that end after from, up to
// horizonDays ahead, blackouts removed, soonest first.
func (w Window) occurrences(from time.Time) []Range {
	var out []Range
	local := from.In(w.Loc)
	// Start a day early: yesterday's 22:00-02:00 may still be open.
	day := time.Date(local.Year(), local.Month(), local.Day()-1, 0, 0, 0, 0, w.Loc)
	for i := range horizonDays {
		d := time.Date(day.Year(), day.Month(), day.Day()+i, 0, 0, 0, 0, w.Loc)
		for _, wk := range w.Weekly {
			if !slices.Contains(wk.Days, d.Weekday()) {
				continue
			}
			start := time.Date(d.Year(), d.Month(), d.Day(), 0, int(wk.From), 0, 0, w.Loc)
			endDay := d.Day()
			if wk.To <= wk.From {
				endDay++
			}
			end := time.Date(d.Year(), d.Month(), endDay, 0, int(wk.To), 0, 0, w.Loc)
			if end.After(from) && end.After(start) {
				out = append(out, Range{Start: start, End: end, Name: w.Name, Kind: "weekly"})
			}
		}
	}
	for _, o := range w.Once {
		if o.End.After(from) {
			out = append(out, Range{Start: o.Start, End: o.End, Name: w.Name, Kind: "once"})
		}
	}
	return w.clip(out)
}

// clip removes blackout days (local midnight to local midnight, whatever
// their length on a daylight-saving change) from the ranges.
func (w Window) clip(rs []Range) []Range {
	for _, b := range w.Blackouts {
		bs := time.Date(b.Year, b.Month, b.Day, 0, 0, 0, 0, w.Loc)
		be := time.Date(b.Year, b.Month, b.Day+1, 0, 0, 0, 0, w.Loc)
		var next []Range
		for _, r := range rs {
			if !r.Start.Before(be) || !r.End.After(bs) {
				next = append(next, r)
				continue
			}
			if r.Start.Before(bs) {
				next = append(next, Range{Start: r.Start, End: bs, Name: r.Name, Kind: r.Kind})
			}
			if r.End.After(be) {
				next = append(next, Range{Start: be, End: r.End, Name: r.Name, Kind: r.Kind})
			}
		}
		rs = next
	}
	return rs
}

// Schedule is one group's windows.
type Schedule []Window

// Next returns up to n ranges of the group's windows that end after from,
// overlapping or touching ranges merged (so the arbiter sees one permit,
// not two that alternate), soonest first. The first may already be open.
func (s Schedule) Next(from time.Time, n int) []Range {
	var all []Range
	for _, w := range s {
		all = append(all, w.occurrences(from)...)
	}
	slices.SortFunc(all, func(a, b Range) int {
		return cmp.Or(a.Start.Compare(b.Start), a.End.Compare(b.End), strings.Compare(a.Name, b.Name))
	})
	var out []Range
	for _, r := range all {
		if k := len(out) - 1; k >= 0 && !r.Start.After(out[k].End) {
			last := &out[k]
			if r.End.After(last.End) {
				last.End = r.End
			}
			if !slices.Contains(strings.Split(last.Name, "+"), r.Name) {
				last.Name += "+" + r.Name
				last.Kind = "merged"
			}
			continue
		}
		if len(out) == n {
			break
		}
		out = append(out, r)
	}
	return out
}

// Open returns the range open at t, if any.
func (s Schedule) Open(t time.Time) (Range, bool) {
	for _, r := range s.Next(t, 1) {
		if !t.Before(r.Start) && t.Before(r.End) {
			return r, true
		}
	}
	return Range{}, false
}

// Tick is one failback-permitted tick.
type Tick struct {
	Start time.Time // aligned to the window's start, so every instance agrees
	Range Range     // the open window; the permit is valid until its end
}

// At says what is due at now: the tick of the window open at now (if any),
// and when to look again, always after now. Ticks are aligned to the start
// of their window every `every`, so instances that wake at slightly
// different times compute the same tick (and the same permit id).
func (s Schedule) At(now time.Time, every time.Duration) (*Tick, time.Time) {
	next := s.Next(now, 1)
	if len(next) == 0 {
		return nil, now.Add(24 * time.Hour) // nothing configured ahead: look again tomorrow
	}
	r := next[0]
	if now.Before(r.Start) {
		return nil, r.Start
	}
	k := now.Sub(r.Start) / every
	start := r.Start.Add(k * every)
	wake := start.Add(every)
	if r.End.Before(wake) {
		wake = r.End
	}
	return &Tick{Start: start, Range: r}, wake
}
