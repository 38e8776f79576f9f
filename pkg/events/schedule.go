package events

import "time"

// SchedulePlan is the scheduler's view of the failback windows to come, kept
// in the state bucket under ScheduleKey so that `fanctl windows` shows what
// the running scheduler will permit (not what a config file on the operator's
// laptop says). Every scheduler instance computes the same plan from the
// same configuration, so which one wrote it last does not matter.
type SchedulePlan struct {
	Cluster   string          `json:"cluster"`
	UpdatedAt time.Time       `json:"updated_at"`
	UpdatedBy string          `json:"updated_by"`
	Groups    []GroupSchedule `json:"groups"`
}

// GroupSchedule is one group's next windows, soonest first.
type GroupSchedule struct {
	Group string `json:"group"`
	// Open is the window open right now, if any.
	Open    *PlannedWindow  `json:"open,omitempty"`
	Windows []PlannedWindow `json:"windows"`
}

// PlannedWindow is one occurrence of a failback window, already clipped by
// blackout dates.
type PlannedWindow struct {
	Window   string    `json:"window"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	TimeZone string    `json:"time_zone"`
	// Kind is "weekly" or "once".
	Kind string `json:"kind"`
}

// ScheduleKey is where the scheduler keeps its plan.
func ScheduleKey(cluster string) string { return "sched." + cluster + ".plan" }

// AllScheduleKeys matches every cluster's schedule plan.
func AllScheduleKeys() string { return ScheduleKey("*") }
