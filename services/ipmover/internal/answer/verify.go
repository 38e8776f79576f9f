package answer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fanpbx/fan/pkg/sipoptions"
)

// Pinger sends one SIP OPTIONS and waits for its final reply (*sipoptions.Pinger).
type Pinger interface {
	Ping(ctx context.Context) (sipoptions.Reply, error)
}

// Verify pings until a final reply arrives or ctx ends, each attempt
// bounded by every: right after a claim the first OPTIONS can be lost
// (a reload still in progress, a socket not yet bound), so one try is not
// enough, and the caller's deadline, not a count, is the limit. Any final
// reply proves a SIP stack answers on the address; its status is returned
// for the record.
func Verify(ctx context.Context, p Pinger, every time.Duration) (sipoptions.Reply, int, error) {
	var last error
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, every)
		r, err := p.Ping(actx)
		cancel()
		if err == nil {
			return r, n, nil
		}
		last = err
		if errors.Is(err, sipoptions.ErrClosed) {
			return sipoptions.Reply{}, n, err
		}
		if ctx.Err() != nil {
			return sipoptions.Reply{}, n, fmt.Errorf("answer verify: no SIP answer after %d OPTIONS: %w (last: %v)", n, ctx.Err(), last)
		}
		// A refused port returns at once: pace the retries.
		t := time.NewTimer(min(every, 50*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}
