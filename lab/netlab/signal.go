package netlab

import (
	"os"
	"os/signal"
	"syscall"
)

// CloseOnSignal is for long-running callers (the demo, the benchmark): on SIGINT or
// SIGTERM it closes the lab and then re-raises the signal with default handling, so the
// process still dies the way the sender expected. stop undoes the registration; call it
// once the caller closes the lab itself.
func (l *Lab) CloseOnSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	quit := make(chan struct{})
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			l.log.Info("netlab: closing on signal", "signal", sig)
			if err := l.Close(); err != nil {
				l.log.Error("netlab: close on signal", "err", err)
			}
			signal.Reset(sig)
			if s, ok := sig.(syscall.Signal); ok {
				_ = syscall.Kill(os.Getpid(), s)
			}
		case <-quit:
		}
	}()
	var stopped bool
	return func() {
		if !stopped {
			stopped = true
			signal.Stop(ch)
			close(quit)
		}
	}
}
