package bus_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
)

func TestProvisionIsIdempotentAndNeverFights(t *testing.T) {
	s := bustest.Server(t)
	ctx := context.Background()
	first := bustest.Connect(t, s, ident("arbiter", "ctl"))
	// Several services starting at once all provision; none may fail, and a
	// differently configured one must leave the existing streams alone.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := bus.Config{URL: s.ClientURL()}
			if i == 3 {
				cfg.EventsMaxAge = config.Duration(time.Hour)
			}
			b, err := bus.Connect(ctx, cfg, ident("svc", "n1"), slog.New(slog.DiscardHandler))
			if err != nil {
				errs <- err
				return
			}
			defer b.Close()
			errs <- b.Provision(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent provision: %v", err)
		}
	}
	st, err := first.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxAge; got != 90*24*time.Hour {
		t.Fatalf("events max age changed to %v by a later instance", got)
	}
}
