// Package metricstest reads a running service's /metrics the way
// Prometheus does (over HTTP, in the text format), for tests that check a
// metric moves when something real happens.
package metricstest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// Listen returns a loopback host:port nobody listens on, for a service's
// http_listen.
func Listen(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Scrape fetches addr's /metrics: each sample's series (name and labels as
// exposed, labels in name order) mapped to its value.
func Scrape(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, nil
}

// WaitFor scrapes addr until series exists and ok(value) holds, and
// returns that value; past within it fails the test with what it saw.
func WaitFor(t testing.TB, addr, series string, ok func(float64) bool, within time.Duration) float64 {
	t.Helper()
	var v float64
	waittest.Succeeds(t, within, series+" to hold the value waited for", func() error {
		m, err := Scrape(addr)
		var present bool
		v, present = m[series]
		if err == nil && present && ok(v) {
			return nil
		}
		return fmt.Errorf("present %v value %v (scrape error %v)", present, v, err)
	})
	return v
}

// Is returns a predicate for WaitFor: the value equals want.
func Is(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

// AtLeast returns a predicate for WaitFor: the value is want or more.
func AtLeast(want float64) func(float64) bool { return func(v float64) bool { return v >= want } }
