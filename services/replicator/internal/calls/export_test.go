package calls

import "time"

// PlannedAt is the clock's time of r's last plan pass.
func PlannedAt(r *Recorder) time.Time { return time.Unix(0, r.plannedAt.Load()) }
