package chaos

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// Probe is one SIP OPTIONS sent to the floating IP, by the time it was sent.
type Probe struct {
	Sent     time.Time
	Answered bool
	Node     string // who answered
}

// SIPObserver probes the floating IP from the client namespace every
// Interval with overlapping probes (a probe lost to a dead holder never
// delays the next), as a phone would experience the address.
type SIPObserver struct {
	Interval, Timeout time.Duration

	p       *sipoptions.Pinger
	mu      sync.Mutex
	probes  []Probe
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped sync.Once
}

// NewSIPObserver opens the pinger in the client namespace.
func NewSIPObserver(l *netlab.Lab, interval, timeout time.Duration) (*SIPObserver, error) {
	o := &SIPObserver{Interval: interval, Timeout: timeout}
	err := l.Do(netlab.ClientHost, func() error {
		var err error
		o.p, err = sipoptions.NewPinger(netip.AddrPortFrom(l.FloatingIP().Addr(), netlab.SIPPort).String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return o, nil
}

// Start begins probing.
func (o *SIPObserver) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		t := time.NewTicker(o.Interval)
		defer t.Stop()
		for {
			sent := time.Now()
			o.wg.Add(1)
			go func() {
				defer o.wg.Done()
				pctx, pcancel := context.WithTimeout(ctx, o.Timeout)
				defer pcancel()
				r, err := o.p.Ping(pctx)
				o.mu.Lock()
				defer o.mu.Unlock()
				o.probes = append(o.probes, Probe{Sent: sent, Answered: err == nil, Node: r.ServerNode})
			}()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Stop ends probing (probes in flight are abandoned) and closes the socket.
func (o *SIPObserver) Stop() {
	o.stopped.Do(func() {
		if o.cancel != nil {
			o.cancel()
			o.wg.Wait()
		}
		o.p.Close()
	})
}

// Probes returns every finished probe so far.
func (o *SIPObserver) Probes() []Probe {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Probe(nil), o.probes...)
}
