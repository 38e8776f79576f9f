package netlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MarkerDir holds one marker per live lab, naming the owning process.
const MarkerDir = "/run/fan-netlab"

type marker struct {
	Prefix string `json:"prefix"`
	PID    int    `json:"pid"`
	// Start is the owner's start time in clock ticks since boot; with the pid it
	// identifies the process even after the pid is reused.
	Start uint64 `json:"start"`
	Dir   string `json:"dir"`
}

var nsNameRE = regexp.MustCompile(`^(fan[0-9a-f]{4})-[a-z][a-z0-9]*$`)

func markerPath(prefix string) string { return filepath.Join(MarkerDir, prefix+".json") }

// writeMarker claims prefix; it fails with os.ErrExist if another lab holds it.
func writeMarker(prefix, dir string) error {
	if err := os.MkdirAll(MarkerDir, 0o755); err != nil {
		return fmt.Errorf("marker dir: %w", err)
	}
	start, err := procStart(os.Getpid())
	if err != nil {
		return fmt.Errorf("own start time: %w", err)
	}
	b, err := json.Marshal(marker{Prefix: prefix, PID: os.Getpid(), Start: start, Dir: dir})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(markerPath(prefix), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("claim %s: %w", prefix, err)
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(markerPath(prefix))
		return fmt.Errorf("write marker %s: %w", prefix, err)
	}
	return nil
}

// procStart reads field 22 (starttime) of /proc/PID/stat. The command name in field 2 may
// contain spaces and parentheses, so fields are counted after the last ')'.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("netlab: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0, fmt.Errorf("netlab: short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

func ownerAlive(m marker) bool {
	if m.PID <= 0 {
		return false
	}
	start, err := procStart(m.PID)
	return err == nil && start == m.Start
}

// Sweep removes the leftovers of labs whose owner process is gone: it kills the
// processes in their namespaces, deletes the namespaces and their temp dirs, and drops
// the markers. Namespaces that match the lab naming pattern but have no marker are
// leftovers too, since Build writes the marker before it makes any namespace. Labs of live
// owners (parallel test binaries) are left alone. It returns the namespaces it removed.
func Sweep(log *slog.Logger) ([]string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	byPrefix := map[string][]string{}
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	for _, e := range ents {
		if m := nsNameRE.FindStringSubmatch(e.Name()); m != nil {
			byPrefix[m[1]] = append(byPrefix[m[1]], e.Name())
		}
	}
	ments, err := os.ReadDir(MarkerDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	for _, e := range ments {
		if p, ok := strings.CutSuffix(e.Name(), ".json"); ok && prefixRE.MatchString(p) {
			if _, seen := byPrefix[p]; !seen {
				byPrefix[p] = nil
			}
		}
	}
	prefixes := make([]string, 0, len(byPrefix))
	for p := range byPrefix {
		prefixes = append(prefixes, p)
	}
	sort.Strings(prefixes)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var removed []string
	var errs []error
	for _, p := range prefixes {
		var m marker
		hasMarker := false
		if b, err := os.ReadFile(markerPath(p)); err == nil {
			if json.Unmarshal(b, &m) == nil {
				hasMarker = true
			}
		}
		if hasMarker && ownerAlive(m) {
			continue
		}
		log.Info("netlab sweep: removing leftover lab", "prefix", p, "owner_pid", m.PID, "namespaces", byPrefix[p])
		nsOK := true
		// Delete the LAN namespace last, as Close does.
		nss := byPrefix[p]
		sort.Slice(nss, func(i, j int) bool {
			return !strings.HasSuffix(nss[i], "-"+lanName) && strings.HasSuffix(nss[j], "-"+lanName)
		})
		for _, ns := range nss {
			if err := removeNS(ctx, ns); err != nil {
				errs = append(errs, err)
				nsOK = false
				continue
			}
			removed = append(removed, ns)
		}
		// Only a dir that is recognisably this lab's is removed, so a corrupt marker
		// cannot delete anything else.
		if hasMarker && m.Dir != "" && strings.HasPrefix(filepath.Base(m.Dir), p+"-") {
			if err := os.RemoveAll(m.Dir); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", m.Dir, err))
			}
		}
		if nsOK {
			if err := os.Remove(markerPath(p)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("sweep: %w", err)
	}
	return removed, nil
}
