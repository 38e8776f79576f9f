package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

var hashA = strings.Repeat("a1", 32)

func TestContentRequestBounds(t *testing.T) {
	good := ContentRequest{Group: "pbx", Tree: "voicemail", Ranges: []ContentRange{{Hash: hashA, Length: 10}}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
	cases := map[string]func(r *ContentRequest){
		"no group":        func(r *ContentRequest) { r.Group = "" },
		"wildcard tree":   func(r *ContentRequest) { r.Tree = "*" },
		"no ranges":       func(r *ContentRequest) { r.Ranges = nil },
		"upper-case hash": func(r *ContentRequest) { r.Ranges[0].Hash = strings.ToUpper(hashA) },
		"short hash":      func(r *ContentRequest) { r.Ranges[0].Hash = hashA[:63] },
		"path for a hash": func(r *ContentRequest) { r.Ranges[0].Hash = "../../../../etc/shadow" + hashA[22:] },
		"negative offset": func(r *ContentRequest) { r.Ranges[0].Offset = -1 },
		"zero length":     func(r *ContentRequest) { r.Ranges[0].Length = 0 },
		"too many ranges": func(r *ContentRequest) {
			for range MaxContentRanges {
				r.Ranges = append(r.Ranges, r.Ranges[0])
			}
		},
		"negative length":    func(r *ContentRequest) { r.Ranges[0].Length = -5 },
		"hash with a suffix": func(r *ContentRequest) { r.Ranges[0].Hash = hashA + "x" },
	}
	for name, mutate := range cases {
		r := good
		r.Ranges = append([]ContentRange(nil), good.Ranges...)
		mutate(&r)
		if err := r.Validate(); !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: want ErrInvalidField, got %v", name, err)
		}
	}
	big := `{"group":"pbx","tree":"voicemail","ranges":[],"pad":"` + strings.Repeat("x", MaxContentRequest) + `"}`
	if _, err := DecodeContentRequest([]byte(big)); !errors.Is(err, ErrInvalidField) {
		t.Errorf("oversized request: want ErrInvalidField, got %v", err)
	}
}

func TestContentLengths(t *testing.T) {
	req := ContentRequest{Ranges: []ContentRange{{Hash: hashA, Length: 10}, {Hash: hashA, Length: 5}, {Hash: hashA, Length: 7}}}
	v := FormatContentLengths([]int64{10, -1, 3})
	if v != "10,-,3" {
		t.Fatalf("format: %q", v)
	}
	got, err := ParseContentLengths(v, req, 13)
	if err != nil || len(got) != 3 || got[0] != 10 || got[1] != -1 || got[2] != 3 {
		t.Fatalf("parse: %v %v", got, err)
	}
	if got, err := ParseContentLengths("10", req, 10); err != nil || len(got) != 1 {
		t.Errorf("an answer stopping early: %v %v", got, err)
	}
	for name, c := range map[string]struct {
		v    string
		size int
	}{
		"missing":               {"", 0},
		"longer than asked":     {"10,5,7,1", 23},
		"over its range":        {"11", 11},
		"not adding up":         {"10,5", 14},
		"negative":              {"-3", 0},
		"not a number":          {"ten", 10},
		"overflowing":           {"99999999999999999999", 0},
		"more bytes than named": {"1", 100},
	} {
		if _, err := ParseContentLengths(c.v, req, c.size); !errors.Is(err, ErrInvalidField) {
			t.Errorf("%s (%q): want ErrInvalidField, got %v", name, c.v, err)
		}
	}
}

// FuzzContentRequest: the decoder a holder runs on its peers' requests
// must never panic, and what it accepts is within the bounds a holder
// relies on; the lengths parser must never accept a list that does not
// fit the request and the body (run: go test -fuzz FuzzContentRequest ./pkg/events).
func FuzzContentRequest(f *testing.F) {
	ok, _ := json.Marshal(ContentRequest{Group: "pbx", Tree: "voicemail", Ranges: []ContentRange{{Hash: hashA, Offset: 3, Length: 10}}})
	f.Add(ok, "10", 10)
	f.Add([]byte(`{"group":"pbx","tree":"voicemail","ranges":[{"hash":"x","length":-1}]}`), "-,4", 4)
	f.Add([]byte(`[]`), ",,", 0)
	f.Fuzz(func(t *testing.T, b []byte, lengths string, size int) {
		r, err := DecodeContentRequest(b)
		if err != nil {
			return
		}
		if len(r.Ranges) == 0 || len(r.Ranges) > MaxContentRanges {
			t.Fatalf("accepted %d ranges", len(r.Ranges))
		}
		for _, rg := range r.Ranges {
			if !ValidContentHash(rg.Hash) || rg.Offset < 0 || rg.Length <= 0 {
				t.Fatalf("accepted range %+v", rg)
			}
		}
		ls, err := ParseContentLengths(lengths, r, size)
		if err != nil {
			return
		}
		var sum int64
		for i, n := range ls {
			if n > r.Ranges[i].Length || n < -1 {
				t.Fatalf("accepted length %d for a range of %d", n, r.Ranges[i].Length)
			}
			if n > 0 {
				sum += n
			}
		}
		if len(ls) > len(r.Ranges) || sum != int64(size) {
			t.Fatalf("accepted %d lengths adding to %d for %d ranges and %d bytes", len(ls), sum, len(r.Ranges), size)
		}
	})
}
