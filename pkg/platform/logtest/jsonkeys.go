package logtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// DuplicateKeys returns the keys that one JSON log line carries twice in
// the same object (a group's keys as "group.key"). encoding/json keeps the
// last of two equal keys without a word, and so do most log pipelines: a
// line with "node" twice loses one of the two nodes it was about.
func DuplicateKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var dups []string
	if err := walkValue(dec, "", &dups); err != nil {
		return nil, err
	}
	return dups, nil
}

// walkValue reads one value; in an object it notes repeated keys.
func walkValue(dec *json.Decoder, path string, dups *[]string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return err
			}
			k, ok := kt.(string)
			if !ok {
				return fmt.Errorf("object key %v is not a string", kt)
			}
			if seen[k] {
				*dups = append(*dups, path+k)
			}
			seen[k] = true
			if err := walkValue(dec, path+k+".", dups); err != nil {
				return err
			}
		}
		_, err := dec.Token() // '}'
		return err
	case json.Delim('['):
		for dec.More() {
			if err := walkValue(dec, path, dups); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	return nil
}

// CheckJSONLines fails t for every line of out (a JSON handler's output)
// that is not a JSON object or carries a key twice, and returns the lines
// decoded, for the test's own assertions.
func CheckJSONLines(t testing.TB, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		dups, err := DuplicateKeys(b)
		if err != nil {
			t.Errorf("log line is not JSON (%v): %s", err, b)
			continue
		}
		if len(dups) > 0 {
			t.Errorf("log line carries %s more than once: %s", strings.Join(dups, ", "), b)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("log line is not a JSON object (%v): %s", err, b)
			continue
		}
		lines = append(lines, m)
	}
	if err := sc.Err(); err != nil {
		t.Errorf("reading log output: %v", err)
	}
	return lines
}
