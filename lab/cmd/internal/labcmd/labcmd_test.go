package labcmd

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"
)

func TestExit(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
		out  string
	}{
		{nil, 0, ""},
		{errors.New("no lab"), 1, "fan-lab: no lab\n"},
		{fmt.Errorf("parse: %w", flag.ErrHelp), 2, ""},
		{Status(2, errors.New("-topology: bad")), 2, "fan-lab: -topology: bad\n"},
		{Status(130, nil), 130, ""},
	} {
		var w bytes.Buffer
		if code := Exit(&w, "fan-lab", c.err); code != c.code || w.String() != c.out {
			t.Errorf("Exit(%v) = %d, %q; want %d, %q", c.err, code, w.String(), c.code, c.out)
		}
	}
}
