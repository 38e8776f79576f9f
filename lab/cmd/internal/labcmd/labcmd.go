// Package labcmd is the main preamble the lab's commands (lab/cmd/*) share:
// -version, a context that SIGINT and SIGTERM cancel, the error line and
// the exit status.
package labcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Main runs a lab command and exits. `NAME -version` prints NAME and
// version. Otherwise run gets a context that SIGINT or SIGTERM cancels and
// the arguments after the program's name, and the process exits with
// Exit's status for what run returned.
func Main(name, version string, run func(ctx context.Context, args []string) error) {
	if len(os.Args) == 2 && (os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Println(name, version)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	os.Exit(Exit(os.Stderr, name, err))
}

// Exit reports err on w as "NAME: err" and returns the exit status: 0 for
// nil, 2 for -help (flag.ErrHelp: the usage is already printed) and a
// status error's own status, 1 for anything else.
func Exit(w io.Writer, name string, err error) int {
	if err == nil {
		return 0
	}
	code := 1
	var s *statusError
	switch {
	case errors.As(err, &s):
		code = s.code
		if s.err == nil {
			return code
		}
		err = s.err
	case errors.Is(err, flag.ErrHelp):
		return 2
	}
	fmt.Fprintf(w, "%s: %v\n", name, err)
	return code
}

// Status ends a command with code; err, when not nil, is printed as any
// error is. A command that said what it had to returns Status(code, nil).
func Status(code int, err error) error { return &statusError{code: code, err: err} }

type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *statusError) Unwrap() error { return e.err }
