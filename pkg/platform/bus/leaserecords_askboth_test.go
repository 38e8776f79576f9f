package bus

import (
	"context"
	"errors"
	"testing"
	"time"
)

// askBoth's rules with the two reads played by hand: which answer stands,
// and that it never waits for a read it does not need.
func TestAskBoth(t *testing.T) {
	errGone := errors.New("gone")
	answer := func(v string, err error) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return v, err }
	}
	late := func(v string, after time.Duration) func(context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			select {
			case <-time.After(after):
				return v, nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
	}
	silent := func(ctx context.Context) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}
	isFinal := func(v string) bool { return v == "final" }
	for _, tc := range []struct {
		name           string
		direct, leader func(context.Context) (string, error)
		bound          time.Duration // the caller's context
		want           string
		wantErr        bool
		within         time.Duration
	}{
		{"leader's answer beats a replica's that is not final", late("replica", 50*time.Millisecond), answer("leader", nil), time.Second, "leader", false, 500 * time.Millisecond},
		{"a replica's not-final answer waits for the leader", answer("replica", nil), late("leader", 100*time.Millisecond), time.Second, "leader", false, 500 * time.Millisecond},
		{"a final answer from the replica does not wait for a silent leader", answer("final", nil), silent, 5 * time.Second, "final", false, 500 * time.Millisecond},
		{"the leader's answer does not wait for a silent replica", silent, answer("leader", nil), 5 * time.Second, "leader", false, 500 * time.Millisecond},
		{"a replica's answer stands when the leader fails", answer("replica", nil), answer("", errGone), time.Second, "replica", false, 500 * time.Millisecond},
		{"a replica's answer stands when the leader is silent to the end", answer("replica", nil), silent, 200 * time.Millisecond, "replica", false, time.Second},
		{"both fail", answer("", errGone), answer("", errGone), time.Second, "", true, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), tc.bound)
			defer cancel()
			start := time.Now()
			got, err := askBoth(ctx, tc.direct, tc.leader, isFinal)
			if took := time.Since(start); took > tc.within {
				t.Errorf("took %v, want within %v", took, tc.within)
			}
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
			if tc.wantErr && !errors.Is(err, errGone) {
				t.Fatalf("error %v does not carry the reads' errors", err)
			}
		})
	}
}
