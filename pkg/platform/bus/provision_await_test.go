package bus_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// TestAwaitProvisionedWaitsForTheAdmin: a service started before the
// admin provisioned creates nothing and is ready within a moment of the
// provisioning, not after a create attempt's timeout and backoff.
func TestAwaitProvisionedWaitsForTheAdmin(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svc, err := bus.Connect(ctx, bus.Config{URL: s.ClientURL()}, bus.Identity{Cluster: "c", Service: "prober", Node: "n1"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	// Every lookup of a missing stream is a JetStream API request the
	// server answers with an error: it counts the waiting service's looks.
	apiErrors := func() uint64 {
		jsz, err := s.Jsz(nil)
		if err != nil {
			t.Fatal(err)
		}
		return jsz.API.Errors
	}
	before := apiErrors()
	ready := make(chan time.Time, 1)
	go func() {
		if err := svc.AwaitProvisioned(ctx); err != nil {
			t.Error(err)
		}
		ready <- time.Now()
	}()
	waittest.Until(t, 10*time.Second, "six lookups of missing streams", func() bool { return apiErrors() >= before+6 })
	select {
	case <-ready:
		t.Fatal("ready before anything was provisioned")
	default:
	}
	if _, err := svc.JS.Stream(ctx, bus.CommandsStream); err == nil {
		t.Fatal("the waiting service created a stream")
	}
	admin := bustest.Connect(t, s, bus.Identity{Cluster: "c", Service: "fanctl", Node: "admin"})
	provisioned := time.Now()
	_ = admin
	select {
	case at := <-ready:
		t.Logf("ready %v after the admin provisioned", at.Sub(provisioned).Round(time.Millisecond))
		// Four lookups a second: well under the 5 s a create attempt on a
		// bus with permissions waited before.
		if d := at.Sub(provisioned); d > 2*time.Second {
			t.Errorf("ready %v after provisioning", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not ready 10 s after provisioning")
	}
}
