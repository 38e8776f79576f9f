// Package telemetry reads the host figures a heartbeat carries (CPU
// and memory, plus load and uptime) from /proc.
package telemetry

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Sample is one reading.
type Sample struct {
	CPUPercent        float64
	MemAvailableBytes uint64
	MemTotalBytes     uint64
	Load1             float64
	UptimeSeconds     float64
}

// Sampler computes CPU use between successive calls.
type Sampler struct {
	proc              string
	lastBusy, lastAll uint64
}

// NewSampler reads from /proc.
func NewSampler() *Sampler { return &Sampler{proc: "/proc"} }

// Read takes a sample. CPU is the share of all CPUs busy since the previous
// call (0 on the first).
func (s *Sampler) Read() (Sample, error) {
	var out Sample
	busy, all, err := s.cpu()
	if err != nil {
		return out, err
	}
	if s.lastAll != 0 && all > s.lastAll {
		out.CPUPercent = 100 * float64(busy-s.lastBusy) / float64(all-s.lastAll)
	}
	s.lastBusy, s.lastAll = busy, all
	if out.MemTotalBytes, out.MemAvailableBytes, err = s.mem(); err != nil {
		return out, err
	}
	if out.Load1, err = s.firstFloat("loadavg"); err != nil {
		return out, err
	}
	if out.UptimeSeconds, err = s.firstFloat("uptime"); err != nil {
		return out, err
	}
	return out, nil
}

func (s *Sampler) cpu() (busy, all uint64, err error) {
	b, err := os.ReadFile(s.proc + "/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("read stat: %w", err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("parse stat: unexpected first line %q", line)
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parse stat field %d: %w", i, err)
		}
		all += n
		if i != 3 && i != 4 { // idle and iowait are not busy
			busy += n
		}
	}
	return busy, all, nil
}

func (s *Sampler) mem() (total, avail uint64, err error) {
	f, err := os.Open(s.proc + "/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("read meminfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail = n << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("parse meminfo: no MemTotal")
	}
	return total, avail, sc.Err()
}

func (s *Sampler) firstFloat(name string) (float64, error) {
	b, err := os.ReadFile(s.proc + "/" + name)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("parse %s: empty", name)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", name, err)
	}
	return v, nil
}
