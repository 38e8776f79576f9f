package app

import (
	"fmt"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/scheduler/internal/window"
)

// Config is the scheduler's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	// TickEvery is how often an open window's permit is restated (default
	// 1m). At most 1m: a restarted instance republishes the current tick,
	// and the audit stream de-duplicates ids for 2 minutes.
	TickEvery config.Duration `yaml:"tick_every"`
	// PlanAhead is how many coming windows per group the plan lists (default 5).
	PlanAhead int           `yaml:"plan_ahead"`
	Groups    []GroupConfig `yaml:"groups"`
}

// GroupConfig lists a group's failback windows.
type GroupConfig struct {
	Name    string         `yaml:"name"`
	Windows []WindowConfig `yaml:"windows"`
}

// WindowConfig is one named window.
type WindowConfig struct {
	Name string `yaml:"name"`
	// TimeZone is an IANA name (Europe/Berlin); default UTC.
	TimeZone string         `yaml:"time_zone"`
	Weekly   []WeeklyConfig `yaml:"weekly"`
	Once     []OnceConfig   `yaml:"once"`
	// BlackoutDates (YYYY-MM-DD, in TimeZone) close the window for the whole day.
	BlackoutDates []string `yaml:"blackout_dates"`
}

// WeeklyConfig is "on these days, from HH:MM to HH:MM" (to before from: ends the next day).
type WeeklyConfig struct {
	// Days: mon..sun, or "daily", "weekdays", "weekends".
	Days []string `yaml:"days"`
	From string   `yaml:"from"`
	To   string   `yaml:"to"`
}

// OnceConfig is a one-off window, RFC 3339 times with an offset.
type OnceConfig struct {
	From string `yaml:"from"`
	To   string `yaml:"to"`
}

// Validate checks the file after loading and fills defaults, reporting
// every key that is wrong.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if c.TickEvery == 0 {
		c.TickEvery = config.Duration(time.Minute)
	}
	if d := c.TickEvery.D(); d < time.Second || d > time.Minute {
		errs = append(errs, config.Errf("tick_every", "must be between 1s and 1m, got %v", d))
	}
	if c.PlanAhead == 0 {
		c.PlanAhead = 5
	}
	if c.PlanAhead < 1 || c.PlanAhead > 100 {
		errs = append(errs, config.Errf("plan_ahead", "must be 1..100, got %d", c.PlanAhead))
	}
	errs = append(errs, config.CountIn("groups", len(c.Groups), 0, maxGroups))
	_, err := c.schedules()
	return config.Join(append(errs, err)...)
}

// Ranges of the scheduler's lists (README "Configuration"). A one-off
// window is at most events.MaxPermitSpan long: the permit it yields says so.
const (
	maxGroups    = 64
	maxWindows   = 64
	maxRanges    = 256
	maxBlackouts = 1024
)

var dayNames = map[string][]time.Weekday{
	"sun": {time.Sunday}, "mon": {time.Monday}, "tue": {time.Tuesday}, "wed": {time.Wednesday},
	"thu": {time.Thursday}, "fri": {time.Friday}, "sat": {time.Saturday},
	"daily":    {time.Sunday, time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday, time.Saturday},
	"weekdays": {time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday},
	"weekends": {time.Saturday, time.Sunday},
}

// schedules turns the file into window schedules; the error names every
// key that is wrong (a window with one is left out of the result).
func (c *Config) schedules() (map[string]window.Schedule, error) {
	out := map[string]window.Schedule{}
	var errs []error
	for gi, g := range c.Groups {
		gk := func(k string) string { return fmt.Sprintf("groups[%d].%s", gi, k) }
		if err := events.ValidToken("name", g.Name); err != nil {
			errs = append(errs, &config.FieldError{Key: gk("name"), Err: err})
		} else if _, dup := out[g.Name]; dup {
			errs = append(errs, config.Errf(gk("name"), "duplicate group %q", g.Name))
		}
		var sch window.Schedule
		errs = append(errs, config.CountIn(gk("windows"), len(g.Windows), 0, maxWindows))
		for wi, w := range g.Windows {
			win, err := parseWindow(func(k string) string { return gk(fmt.Sprintf("windows[%d].%s", wi, k)) }, w)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			sch = append(sch, win)
		}
		out[g.Name] = sch
	}
	if err := config.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// parseWindow turns one window into its schedule; wk names its keys.
func parseWindow(wk func(string) string, w WindowConfig) (window.Window, error) {
	errs := []error{
		config.CountIn(wk("weekly"), len(w.Weekly), 0, maxRanges),
		config.CountIn(wk("once"), len(w.Once), 0, maxRanges),
		config.CountIn(wk("blackout_dates"), len(w.BlackoutDates), 0, maxBlackouts),
	}
	if err := events.ValidToken("name", w.Name); err != nil {
		errs = append(errs, &config.FieldError{Key: wk("name"), Err: err})
	}
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		errs = append(errs, config.Errf(wk("time_zone"), "%v", err))
		loc = time.UTC // the ranges are still checked
	}
	win := window.Window{Name: w.Name, Loc: loc}
	for ri, r := range w.Weekly {
		rk := func(k string) string { return wk(fmt.Sprintf("weekly[%d].%s", ri, k)) }
		var wk window.Weekly
		for _, d := range r.Days {
			days, ok := dayNames[strings.ToLower(d)]
			if !ok {
				errs = append(errs, config.Errf(rk("days"), "unknown day %q (mon..sun, daily, weekdays, weekends)", d))
			}
			wk.Days = append(wk.Days, days...)
		}
		if len(r.Days) == 0 {
			errs = append(errs, config.Errf(rk("days"), "at least one day"))
		}
		if wk.From, err = window.ParseClock(r.From); err != nil {
			errs = append(errs, config.Errf(rk("from"), "%v", err))
		}
		if wk.To, err = window.ParseClock(r.To); err != nil {
			errs = append(errs, config.Errf(rk("to"), "%v", err))
		}
		win.Weekly = append(win.Weekly, wk)
	}
	for oi, o := range w.Once {
		ok := func(k string) string { return wk(fmt.Sprintf("once[%d].%s", oi, k)) }
		from, fromErr := time.Parse(time.RFC3339, o.From)
		if fromErr != nil {
			errs = append(errs, config.Errf(ok("from"), "want RFC 3339 with an offset: %v", fromErr))
		}
		to, toErr := time.Parse(time.RFC3339, o.To)
		switch {
		case toErr != nil:
			errs = append(errs, config.Errf(ok("to"), "want RFC 3339 with an offset: %v", toErr))
		case fromErr != nil:
		case !to.After(from):
			errs = append(errs, config.Errf(ok("to"), "must be after from"))
		case to.Sub(from) > events.MaxPermitSpan:
			errs = append(errs, config.Errf(ok("to"), "a one-off window lasts at most %v, got %v", events.MaxPermitSpan, to.Sub(from)))
		}
		win.Once = append(win.Once, window.Range{Start: from.In(loc), End: to.In(loc)})
	}
	for _, b := range w.BlackoutDates {
		d, err := window.ParseDate(b)
		if err != nil {
			errs = append(errs, config.Errf(wk("blackout_dates"), "%v", err))
		}
		win.Blackouts = append(win.Blackouts, d)
	}
	if len(w.Weekly) == 0 && len(w.Once) == 0 {
		errs = append(errs, config.Errf(wk("weekly"), "a window needs weekly or once ranges"))
	}
	return win, config.Join(errs...)
}
