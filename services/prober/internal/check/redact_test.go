package check

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	for raw, want := range map[string]string{
		"http://admin:pw1@host/x?token=pw2&site=a":         "http://admin:REDACTED@host/x?site=a&token=REDACTED",
		"https://host/x?API_KEY=pw3&Password=pw4&q=1":      "https://host/x?API_KEY=REDACTED&Password=REDACTED&q=1",
		"http://host/plain":                                "http://host/plain",
		"http://user@host/":                                "http://user@host/",
		"http://a:p%40ss@host/":                            "http://a:REDACTED@host/",
		"http://host/x?sig=pw5&signature=pw6&auth_hdr=pw7": "http://host/x?auth_hdr=REDACTED&sig=REDACTED&signature=REDACTED",
	} {
		got, secrets := RedactURL(raw)
		if got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
		if strings.Contains(got, "pw") || strings.Contains(got, "p@ss") || strings.Contains(got, "p%40ss") {
			t.Errorf("RedactURL(%q) shows a secret: %q (secrets %q)", raw, got, secrets)
		}
	}
	argv := []string{"/usr/bin/tool", "--user", "u", "--password", "s1", "-k", "s2", "--db-password=s3", "s4", "DSN=postgres://u:s5@db/x", "--mode=fast"}
	shown, secrets := RedactArgs(argv, []string{"--password", "8"})
	got := strings.Join(shown, " ")
	if want := "/usr/bin/tool --user u --password REDACTED -k s2 --db-password=REDACTED REDACTED DSN=postgres://u:REDACTED@db/x --mode=fast"; got != want {
		t.Errorf("RedactArgs = %q\nwant          %q", got, want)
	}
	r := NewRedactor(secrets)
	if out := r.String("failed: s1 s3 s4 s5"); out != "failed: REDACTED REDACTED REDACTED REDACTED" {
		t.Errorf("Redactor = %q (secrets %q)", out, secrets)
	}
	if err := ValidateSecretArgs([]string{"0"}, 3); err == nil {
		t.Error("index 0 (the program) accepted")
	}
	if err := ValidateSecretArgs([]string{"2", "--x="}, 3); err != nil {
		t.Error(err)
	}
}
