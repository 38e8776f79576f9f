// Package procstat reads what a process has cost from /proc: CPU time,
// resident memory and context switches; and fetches its CPU and allocation
// profiles when it serves net/http/pprof. The benchmarks that run one of
// fan's binaries as a process of its own measure it with these, so its
// figures are its own and not those of the peers the benchmark simulates.
package procstat

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// CPU is the user plus system time pid has used.
func CPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields start after its closing ')'.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 || i+2 > len(raw) {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(raw[i+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat utime: %w", pid, err)
	}
	st, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat stime: %w", pid, err)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// RSS is pid's resident memory in MiB (VmRSS).
func RSS(pid int) (float64, error) { return statusMiB(pid, "VmRSS") }

// HWM is the peak of pid's resident memory in MiB (VmHWM).
func HWM(pid int) (float64, error) { return statusMiB(pid, "VmHWM") }

func statusMiB(pid int, field string) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, field, err)
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// Switches sums the voluntary and involuntary context switches of every
// thread of pid. Unlike CPU time it does not grow when other processes
// compete for the CPUs, so it compares versions on a busy machine.
func Switches(pid int) uint64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	var n uint64
	for _, t := range tasks {
		raw, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				c, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// Sample is one reading of a process's CPU time, taken at At.
type Sample struct {
	At  time.Time
	CPU time.Duration
}

// Take reads pid's CPU time now.
func Take(pid int) (Sample, error) {
	c, err := CPU(pid)
	return Sample{At: time.Now(), CPU: c}, err
}

// Share is the CPU pid used between two samples, in cores (1.0: one core
// busy the whole time).
func Share(from, to Sample) float64 {
	wall := to.At.Sub(from.At).Seconds()
	if wall <= 0 {
		return 0
	}
	return (to.CPU - from.CPU).Seconds() / wall
}

// FetchProfile saves one of a process's net/http/pprof profiles, served on
// addr, over window into path: "profile" is CPU time, "allocs" (with
// seconds) the allocations made in the window.
func FetchProfile(addr, name string, window time.Duration, path string) error {
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", addr, name, int(window.Seconds())))
	if err != nil {
		return fmt.Errorf("profile %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", name, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", name, err)
	}
	return f.Close()
}
