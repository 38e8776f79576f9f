package doctor

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// ClockState is what the kernel says of its clock's discipline.
type ClockState struct {
	// Unsync is the kernel's STA_UNSYNC flag: no time daemon (chronyd,
	// ntpd, systemd-timesyncd) has told the kernel the clock is in step,
	// or it last did too long ago.
	Unsync bool
	// MaxError is the kernel's bound on the clock's error; a daemon keeps
	// it small, and it grows by 500 ppm while nobody does.
	MaxError time.Duration
}

// unsyncedAbove is where the kernel (and systemd's NTPSynchronized, which
// reads the same adjtimex(2) fields) gives up on a clock: 16 s of possible
// error.
const unsyncedAbove = 16 * time.Second

// Synced is the verdict timedatectl's NTPSynchronized gives on the same
// state: the flag clear and the error bound below 16 s.
func (c ClockState) Synced() bool { return !c.Unsync && c.MaxError < unsyncedAbove }

// kernelClock reads the clock's discipline with adjtimex(2) in read-only
// mode (no mode bits: nothing is set). It answers the same as timedatectl
// without systemd, D-Bus or a running timedated, so it works in a container
// and on a host where systemd is not PID 1.
func kernelClock() (ClockState, error) {
	var tx unix.Timex
	if _, err := unix.Adjtimex(&tx); err != nil {
		return ClockState{}, fmt.Errorf("adjtimex: %w", err)
	}
	return ClockState{Unsync: tx.Status&unix.STA_UNSYNC != 0, MaxError: time.Duration(tx.Maxerror) * time.Microsecond}, nil
}

// checkClock: the host's clock is kept in step by a time daemon. fan's
// correctness does not rest on synchronized clocks (leases are the
// server's), but the times it records and acts on do: the scheduler opens
// failback windows by this clock, a lease record's age is judged against
// it, certificates are valid by it, and the trail merges events by their
// producers' stamps.
func (r *run) checkClock() {
	st, err := r.o.Clock()
	if err != nil {
		r.out.addf(Warning, "host.clock", "", "", "cannot read the kernel's clock state: %v", err)
		return
	}
	if !st.Synced() {
		why := "STA_UNSYNC is set"
		if !st.Unsync {
			why = fmt.Sprintf("its error bound is %v", st.MaxError)
		}
		r.out.addf(Warning, "host.clock", "",
			"enable a time daemon: timedatectl set-ntp true (systemd-timesyncd), or install chrony; timedatectl's NTPSynchronized reads the same kernel state",
			"the kernel says the clock is not synchronized (adjtimex(2): %s): it drifts freely, and with it the scheduler's failback windows, the age of the arbiter's lease records as judged here, certificate validity and the order of this host's events in the trail", why)
		return
	}
	r.out.addf(OK, "host.clock", "", "", "synchronized (adjtimex(2): STA_UNSYNC clear, error bound %v)", st.MaxError.Round(time.Millisecond))
}
