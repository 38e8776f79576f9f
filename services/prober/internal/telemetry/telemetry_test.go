package telemetry

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSamplerParsesProc(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("stat", "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n")
	write("meminfo", "MemTotal:        4000 kB\nMemFree:  100 kB\nMemAvailable:    1000 kB\n")
	write("loadavg", "0.50 0.40 0.30 1/100 1234\n")
	write("uptime", "3600.25 7000.00\n")
	s := &Sampler{proc: dir}
	first, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	if first.CPUPercent != 0 || first.MemTotalBytes != 4000<<10 || first.MemAvailableBytes != 1000<<10 || first.Load1 != 0.5 || first.UptimeSeconds != 3600.25 {
		t.Fatalf("first sample %+v", first)
	}
	// 100 more busy jiffies out of 400 more in all: 25 %.
	write("stat", "cpu  150 0 150 950 150 0 0 0 0 0\n")
	second, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	if second.CPUPercent != 25 {
		t.Fatalf("cpu %v, want 25", second.CPUPercent)
	}
}

func TestSamplerOnThisHost(t *testing.T) {
	s := NewSampler()
	if _, err := s.Read(); err != nil {
		t.Fatal(err)
	}
	r, err := s.Read()
	if err != nil {
		t.Fatal(err)
	}
	if r.MemTotalBytes == 0 || r.UptimeSeconds <= 0 || r.CPUPercent < 0 || r.CPUPercent > 100 {
		t.Fatalf("implausible sample %+v", r)
	}
}
