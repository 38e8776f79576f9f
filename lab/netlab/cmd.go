package netlab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
)

// runIP runs ip(8) and folds its output into the error, because ip's exit status alone
// never says what went wrong.
func runIP(ctx context.Context, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

func runIPs(ctx context.Context, steps [][]string) error {
	for _, s := range steps {
		if _, err := runIP(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

func ifMAC(ctx context.Context, ns, dev string) (string, error) {
	out, err := runIP(ctx, "-n", ns, "-j", "link", "show", "dev", dev)
	if err != nil {
		return "", err
	}
	var links []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return "", fmt.Errorf("netlab: ip -n %s link show %s: unexpected output %q: %v", ns, dev, out, err)
	}
	return strings.ToLower(links[0].Address), nil
}
