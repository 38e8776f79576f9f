package site

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// PlanName is the install plan in every host's bundle: what install-host
// puts where, with which owner and mode, and which units it runs. Files
// live under the bundle's FilesDir at their destination path
// (files/etc/fan/prober.yaml), so the bundle reads as the tree it installs.
const (
	PlanName      = "install.json"
	FilesDir      = "files"
	InstallScript = "install.sh"
	// PlanVersion is the plan's format; install-host refuses one it does
	// not know (a bundle from a newer fanctl than the host's package).
	PlanVersion = 1
)

// Plan is one host's install plan.
type Plan struct {
	Version int    `json:"version"`
	Cluster string `json:"cluster"`
	Host    string `json:"host"`
	Role    string `json:"role"`
	// Address is the host's own address: install-host checks it is this
	// machine's before installing anything.
	Address string `json:"address"`
	// Dirs are made (or given this owner and mode) before the files.
	Dirs  []PlanDir  `json:"dirs"`
	Files []PlanFile `json:"files"`
	// Units run on this host, in start order (fan-nats first).
	Units []string `json:"units"`
	// Sysctl is applied at install (the file is also read at every boot).
	Sysctl string `json:"sysctl,omitempty"`
	// ManagerUser, when set, is fan's AMI user for Asterisk, installed as
	// AsteriskDir/ManagerInclude if AsteriskDir exists.
	ManagerUser string `json:"manager_user,omitempty"`
}

// PlanDir is a directory with its owner and mode.
type PlanDir struct {
	Path  string `json:"path"`
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  Mode   `json:"mode"`
}

// PlanFile is one file: Path is where it goes, its content is
// FilesDir/Path in the bundle.
type PlanFile struct {
	Path  string `json:"path"`
	Owner string `json:"owner"`
	Group string `json:"group"`
	Mode  Mode   `json:"mode"`
	// Secret marks a seed, key, secret or token: never printed.
	Secret bool `json:"secret,omitempty"`
	// Units are restarted when the file changes, or reloaded when every
	// changed file of the unit says Reload.
	Units  []string `json:"units,omitempty"`
	Reload bool     `json:"reload,omitempty"`
}

// Mode is a permission mode, written in octal ("0640") in the plan.
type Mode os.FileMode

func (m Mode) MarshalJSON() ([]byte, error) {
	return json.Marshal(fmt.Sprintf("%04o", uint32(m)))
}

func (m *Mode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return fmt.Errorf("mode %q: want octal like 0640", s)
	}
	*m = Mode(v)
	return nil
}

// ReadPlan reads a bundle's plan.
func ReadPlan(bundle string) (Plan, error) {
	var p Plan
	b, err := os.ReadFile(filepath.Join(bundle, PlanName))
	if err != nil {
		return p, fmt.Errorf("bundle %s: %w (is this a host's bundle from fanctl init, hosts/<name>?)", bundle, err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("bundle %s: %s: %w", bundle, PlanName, err)
	}
	if p.Version != PlanVersion {
		return p, fmt.Errorf("bundle %s: plan version %d, this fanctl knows %d: install the fan package the bundle was made with", bundle, p.Version, PlanVersion)
	}
	for _, f := range p.Files {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path {
			return p, fmt.Errorf("bundle %s: file %q: want a clean absolute path", bundle, f.Path)
		}
	}
	for _, d := range p.Dirs {
		if !filepath.IsAbs(d.Path) || filepath.Clean(d.Path) != d.Path {
			return p, fmt.Errorf("bundle %s: directory %q: want a clean absolute path", bundle, d.Path)
		}
	}
	return p, nil
}
