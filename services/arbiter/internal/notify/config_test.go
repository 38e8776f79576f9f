package notify

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// -check-config refuses, by its key, a hook whose program or secret is
// missing or unusable; Validate fills the defaults.
func TestCheckFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	prog := write("page.sh", "#!/bin/sh\n", 0o755)
	plain := write("plain.sh", "#!/bin/sh\n", 0o644)
	secret := write("secret", "  0123456789abcdef\n", 0o600)
	short := write("short", "hunter2\n", 0o600)
	hook := func(h HookConfig) Config {
		h.Name = "h"
		return Config{Hooks: []HookConfig{h}}
	}
	wh := func(file string) *WebhookConfig {
		return &WebhookConfig{URL: "https://hooks.example.org/fan", SecretFile: file}
	}
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"program":         {hook(HookConfig{Command: []string{prog}}), ""},
		"secret":          {hook(HookConfig{Webhook: wh(secret)}), ""},
		"missing program": {hook(HookConfig{Command: []string{filepath.Join(dir, "nope")}}), "notify.hooks[0].command"},
		"not executable":  {hook(HookConfig{Command: []string{plain}}), "notify.hooks[0].command"},
		"missing secret":  {hook(HookConfig{Webhook: wh(filepath.Join(dir, "nope"))}), "notify.hooks[0].webhook.secret_file"},
		"short secret":    {hook(HookConfig{Webhook: wh(short)}), "notify.hooks[0].webhook.secret_file"},
	} {
		if err := c.cfg.Validate([]string{"pbx"}); err != nil {
			t.Fatalf("%s: Validate: %v", name, err)
		}
		err := c.cfg.CheckFiles()
		var fe *config.FieldError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case c.want != "" && (!errors.As(err, &fe) || fe.Key != c.want):
			t.Errorf("%s: %v, want a refusal naming %s", name, err, c.want)
		}
	}
	c := hook(HookConfig{Webhook: wh(secret)})
	if err := c.Validate(nil); err != nil {
		t.Fatal(err)
	}
	w := c.Hooks[0].Webhook
	if c.Queue != DefaultQueue || c.CatchUp.D() != DefaultCatchUp || c.Hooks[0].Timeout.D() != DefaultTimeout ||
		w.MaxTries != DefaultMaxTries || w.Backoff.D() != DefaultBackoff || w.MaxBackoff.D() != DefaultMaxBackoff {
		t.Errorf("defaults not filled: %+v %+v", c, w)
	}
	if s, err := readSecret("k", secret); err != nil || string(s) != "0123456789abcdef" {
		t.Errorf("secret %q, %v: surrounding white space is not part of it", s, err)
	}
}
