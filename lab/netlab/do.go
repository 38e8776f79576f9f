package netlab

import (
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread switched into host's network namespace and waits for it.
//
// Sockets are bound to the namespace they are created in, for their whole life: a
// listener or UDP socket made inside fn keeps living in host's namespace after fn returns
// and can be used from any goroutine. That is the way to give a test a client in the "c"
// namespace without running a separate process.
//
// fn runs on its own goroutine (so t.FailNow must not be called in it; return an error)
// and must not start goroutines that expect the namespace: they run on other threads. If
// the thread cannot be switched back, it is discarded rather than returned to the Go
// scheduler, so no other goroutine ever runs in the wrong namespace.
func (l *Lab) Do(host string, fn func() error) error {
	h, err := l.host(host)
	if err != nil {
		return err
	}
	target, err := netns.GetFromPath(filepath.Join(netnsDir, h.NS))
	if err != nil {
		return fmt.Errorf("do on %s: open netns %s: %w", host, h.NS, err)
	}
	defer target.Close()
	// fn's own error comes back as it is.
	return InNamespace(target, fn)
}

// InNamespace runs fn on an OS thread switched into the namespace target and
// waits for it, as Do does for a lab's host; tests that build namespaces of
// their own (netlabtest) enter them the same way. A panic in fn is raised
// again in the caller.
func InNamespace(target netns.NsHandle, fn func() error) error {
	type result struct {
		err      error
		panicked bool
		val      any
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{err: fmt.Errorf("current netns: %w", err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			res <- result{err: fmt.Errorf("enter netns: %w", err)}
			return
		}
		var r result
		func() {
			defer func() {
				if v := recover(); v != nil {
					r = result{panicked: true, val: v}
				}
			}()
			r.err = fn()
		}()
		if err := netns.Set(orig); err != nil {
			// Returning while still locked makes the runtime terminate this thread.
			res <- result{err: fmt.Errorf("restore netns: %w (fn: %v)", err, r.err)}
			return
		}
		runtime.UnlockOSThread()
		res <- r
	}()
	r := <-res
	if r.panicked {
		panic(r.val)
	}
	return r.err
}
