package ami

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// actioner is what the helpers need; Client and Session both provide it.
type actioner interface {
	Action(ctx context.Context, name string, fields ...Field) (Response, error)
}

// ChannelCounts is the parsed output of `core show channels count`.
type ChannelCounts struct {
	Channels  int
	Calls     int
	Processed int
}

// CoreShowChannelsCount runs `core show channels count`, the check that
// proves the core answers: only a running core can count its channels, and
// a deadlocked one accepts the connection but never replies. Healthy only when the
// response is Success and all three output lines parse: an Error is
// ErrUnhealthy (*ActionError), even though it says "Command output follows";
// a Success without the expected lines is ErrProtocol.
func (c *Client) CoreShowChannelsCount(ctx context.Context) (ChannelCounts, error) {
	return coreShowChannelsCount(ctx, c)
}

// CoreShowChannelsCount is Client.CoreShowChannelsCount on the session's connection.
func (s *Session) CoreShowChannelsCount(ctx context.Context) (ChannelCounts, error) {
	return coreShowChannelsCount(ctx, s)
}

// CoreStatus runs the CoreStatus action. An Error answer is ErrUnhealthy.
func (c *Client) CoreStatus(ctx context.Context) (CoreStatus, error) { return coreStatus(ctx, c) }

// CoreStatus is Client.CoreStatus on the session's connection.
func (s *Session) CoreStatus(ctx context.Context) (CoreStatus, error) { return coreStatus(ctx, s) }

// Reload reloads one module (for example "res_pjsip.so"), or everything when
// module is "". Response: Error ("No such module", …) is an *ActionError.
func (c *Client) Reload(ctx context.Context, module string) error { return reload(ctx, c, module) }

// Reload is Client.Reload on the session's connection.
func (s *Session) Reload(ctx context.Context, module string) error { return reload(ctx, s, module) }

func coreShowChannelsCount(ctx context.Context, a actioner) (ChannelCounts, error) {
	const cmd = "core show channels count"
	r, err := a.Action(ctx, "Command", F("Command", cmd))
	if err != nil {
		return ChannelCounts{}, err
	}
	if !r.Success() {
		return ChannelCounts{}, &ActionError{Action: "Command " + cmd, Message: errorText(r), Response: r}
	}
	return ParseChannelsCount(r.Outputs())
}

// ParseChannelsCount parses the Output lines of `core show channels count`
// ("N active channels", "N active calls", "N calls processed", singular for
// 1). Anything missing is ErrProtocol.
func ParseChannelsCount(lines []string) (ChannelCounts, error) {
	// Matched by hand, not with regular expressions: a prober asks this
	// several times a second per PBX. Each line is ^(\d+) <what>$.
	var cc ChannelCounts
	found := 0
	for _, l := range lines {
		digits := len(l) - len(strings.TrimLeft(l, "0123456789"))
		if digits == 0 {
			continue
		}
		var dst *int
		var bit int
		switch l[digits:] {
		case " active channel", " active channels":
			dst, bit = &cc.Channels, 1
		case " active call", " active calls":
			dst, bit = &cc.Calls, 2
		case " call processed", " calls processed":
			dst, bit = &cc.Processed, 4
		default:
			continue
		}
		n, err := strconv.Atoi(l[:digits])
		if err != nil {
			return ChannelCounts{}, fmt.Errorf("core show channels count: %w: %q", ErrProtocol, l)
		}
		*dst = n
		found |= bit
	}
	if found != 7 {
		return ChannelCounts{}, fmt.Errorf("core show channels count: %w: output %q", ErrProtocol, lines)
	}
	return cc, nil
}

// CoreStatus is the answer to the CoreStatus action. Times are in the PBX's
// local time zone as it prints them, read here in the local zone.
type CoreStatus struct {
	Startup        time.Time
	Reload         time.Time
	CurrentCalls   int
	ProcessedCalls int
}

func coreStatus(ctx context.Context, a actioner) (CoreStatus, error) {
	r, err := a.Action(ctx, "CoreStatus")
	if err != nil {
		return CoreStatus{}, err
	}
	if !r.Success() {
		return CoreStatus{}, &ActionError{Action: "CoreStatus", Message: errorText(r), Response: r}
	}
	var st CoreStatus
	var errs []string
	parseTime := func(date, clock string) time.Time {
		t, err := time.ParseInLocation("2006-01-02 15:04:05", r.Field(date)+" "+r.Field(clock), time.Local)
		if err != nil {
			errs = append(errs, date)
		}
		return t
	}
	parseInt := func(name string) int {
		n, err := strconv.Atoi(r.Field(name))
		if err != nil {
			errs = append(errs, name)
		}
		return n
	}
	st.Startup = parseTime("CoreStartupDate", "CoreStartupTime")
	st.Reload = parseTime("CoreReloadDate", "CoreReloadTime")
	st.CurrentCalls = parseInt("CoreCurrentCalls")
	st.ProcessedCalls = parseInt("CoreProcessedCalls")
	if len(errs) > 0 {
		return CoreStatus{}, fmt.Errorf("CoreStatus: %w: bad or missing %v in %q", ErrProtocol, errs, r.String())
	}
	return st, nil
}

func reload(ctx context.Context, a actioner, module string) error {
	var fields []Field
	if module != "" {
		fields = append(fields, F("Module", module))
	}
	r, err := a.Action(ctx, "Reload", fields...)
	if err != nil {
		return err
	}
	if !r.Success() {
		return &ActionError{Action: "Reload " + module, Message: errorText(r), Response: r}
	}
	return nil
}

// errorText is the Message of an Error answer plus any Output, which is
// where a failing Command says what went wrong.
func errorText(r Response) string {
	msg := r.Message()
	for _, o := range r.Outputs() {
		if o != "" {
			msg += ": " + o
		}
	}
	return msg
}
