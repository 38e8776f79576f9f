package procstat

import (
	"os"
	"testing"
	"time"
)

// The test process burns CPU for a while: its own figures must show it.
func TestOwnProcess(t *testing.T) {
	pid := os.Getpid()
	s0, err := Take(pid)
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	s1, err := Take(pid)
	if err != nil {
		t.Fatal(err)
	}
	if s1.CPU <= s0.CPU {
		t.Fatalf("CPU time did not grow while spinning (%v then %v, %d turns)", s0.CPU, s1.CPU, x)
	}
	if sh := Share(s0, s1); sh <= 0 || sh > 64 {
		t.Fatalf("share %v cores", sh)
	}
	rss, err := RSS(pid)
	if err != nil || rss <= 0 {
		t.Fatalf("RSS %v MiB, %v", rss, err)
	}
	hwm, err := HWM(pid)
	if err != nil || hwm < rss {
		t.Fatalf("HWM %v MiB below RSS %v, %v", hwm, rss, err)
	}
	if Switches(pid) == 0 {
		t.Fatal("no context switches counted")
	}
	if _, err := CPU(-1); err == nil {
		t.Fatal("a process that does not exist has a CPU time")
	}
}
