// Package dispatcher steers a Kamailio proxy's dispatcher module: it decides
// which destinations (PBX nodes) may receive new calls, over Kamailio's
// JSON-RPC-over-HTTP interface (jsonrpcs + xhttp, POST /RPC).
//
// States. A node that must receive nothing is set to "d" (disabled): with
// ds_probing_mode=1 Kamailio's own OPTIONS probing overrides "i" within
// seconds while the node still answers, but never touches "d". A node that
// may receive calls is set to "ap" (active + probing), so Kamailio keeps
// probing it and can still take it out by itself if it stops answering.
// Sync therefore treats a node Kamailio has probed down (inactive or trying,
// still probing) as already in the desired Active state: overriding that with
// "ap" would send calls to a node that is not answering.
//
// Weights and priorities. Kamailio 5.6 has no RPC that changes the attributes
// (weight=, priority) of a loaded destination; dispatcher.add/remove exist but
// remove-then-add leaves a moment without the node and both are subject to
// the same reload_delta rate limit as dispatcher.reload, and nothing in memory
// survives a restart or reload anyway. ApplyList therefore rewrites the list
// file atomically, with each node's desired state encoded in its flags
// (4 = disabled, 8 = probing), and calls dispatcher.reload. A weight is
// written twice, as weight=N and rweight=N: the proxy shares calls by the
// weights with algorithm 11 (relative weights: a node gets rweight / the sum
// of the active nodes' rweights, recomputed when a node is disabled), which
// reads rweight. Algorithm 9 reads weight as a percentage of 100 slots and
// gives nothing to the nodes past the hundredth, so fan's 1..100 weights of
// more than one node do not fit it. The cost: a reload
// resets every destination to its file flags, so a node Kamailio had probed
// down is offered calls again until the next probe fails
// (ds_ping_interval × ds_probing_threshold), and reloads are rate-limited by
// reload_delta (default 5 s; ApplyList waits and retries). Because the file
// carries the states, a disabled node is never re-enabled by the reload, and a
// restarted Kamailio starts with the states fan last set.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/platform/durablefile"
)

// State is what fan wants for a destination.
type State int

const (
	// Active: may receive calls while Kamailio's probing finds it alive ("ap").
	Active State = iota + 1
	// Disabled: receives nothing, whatever probing finds ("d").
	Disabled
)

func (s State) String() string {
	switch s {
	case Active:
		return "active"
	case Disabled:
		return "disabled"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// rpcState is the dispatcher.set_state argument for s.
func (s State) rpcState() string {
	if s == Disabled {
		return "d"
	}
	return "ap"
}

// Errors callers branch on.
var (
	// ErrUnknownDestination: a URI in the request is in no dispatcher set.
	// Nothing was changed.
	ErrUnknownDestination = errors.New("dispatcher: destination not in any set")
	// ErrNotApplied: after setting, Kamailio's list still differs.
	ErrNotApplied = errors.New("dispatcher: state not applied")
	// ErrReloadBusy: Kamailio refused a reload within reload_delta.
	ErrReloadBusy = errors.New("dispatcher: reload rate-limited by kamailio (reload_delta)")
	// ErrNoMethod: the RPC method is not available (module not loaded).
	ErrNoMethod = errors.New("dispatcher: rpc method not found")
	// ErrNoListFile: ApplyList needs Config.ListFile.
	ErrNoListFile = errors.New("dispatcher: no list file configured")
)

// Destination is one entry of dispatcher.list.
type Destination struct {
	Set      int
	URI      string
	Flags    string // as Kamailio shows them: A/I/D/T then P (probing) or X
	Priority int
	Weight   int
	RWeight  int    // the relative weight (algorithm 11)
	Attrs    string // the raw attribute string, e.g. "duid=a;weight=50;rweight=50"
}

// Disabled reports whether the destination is administratively disabled.
func (d Destination) Disabled() bool { return strings.HasPrefix(d.Flags, "D") }

// Probing reports whether Kamailio keeps probing it.
func (d Destination) Probing() bool { return len(d.Flags) > 1 && d.Flags[1] == 'P' }

// satisfies reports whether d is already in state s. A probed-down node
// (IP/TP) satisfies Active: Kamailio, not fan, knows it is not answering.
func (d Destination) satisfies(s State) bool {
	if s == Disabled {
		return d.Disabled()
	}
	return !d.Disabled() && d.Probing()
}

// Config locates one Kamailio instance.
type Config struct {
	// URL of the JSON-RPC endpoint, e.g. http://127.0.0.1:5071/RPC.
	URL string `yaml:"url"`
	// Timeout per RPC call; default 3s.
	Timeout time.Duration `yaml:"timeout"`
	// ListFile is the dispatcher list_file Kamailio loads; only ApplyList
	// writes it.
	ListFile string `yaml:"list_file"`
	// ReloadRetry is the wait between reload attempts refused by
	// reload_delta; default 250ms.
	ReloadRetry time.Duration `yaml:"reload_retry"`
}

// Client controls one Kamailio dispatcher. Calls are serialised so that two
// syncs never interleave their read-modify-confirm cycles.
type Client struct {
	cfg Config
	rpc *rpc
	log *slog.Logger
	mu  sync.Mutex
}

// New returns a Client for cfg.
func New(cfg Config, log *slog.Logger) (*Client, error) {
	if cfg.URL == "" {
		return nil, errors.New("dispatcher config: url is required")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.ReloadRetry == 0 {
		cfg.ReloadRetry = 250 * time.Millisecond
	}
	return &Client{
		cfg: cfg,
		rpc: &rpc{url: cfg.URL, http: &http.Client{Timeout: cfg.Timeout}},
		log: log.With("kamailio", cfg.URL),
	}, nil
}

// List returns every destination of every set, as Kamailio holds them now.
func (c *Client) List(ctx context.Context) ([]Destination, error) {
	var res struct {
		Records []struct {
			Set struct {
				ID      int `json:"ID"`
				Targets []struct {
					Dest struct {
						URI      string `json:"URI"`
						Flags    string `json:"FLAGS"`
						Priority int    `json:"PRIORITY"`
						Attrs    struct {
							Body    *string `json:"BODY"`
							Weight  int     `json:"WEIGHT"`
							RWeight int     `json:"RWEIGHT"`
						} `json:"ATTRS"`
					} `json:"DEST"`
				} `json:"TARGETS"`
			} `json:"SET"`
		} `json:"RECORDS"`
	}
	err := c.rpc.call(ctx, "dispatcher.list", &res)
	var re *RPCError
	if errors.As(err, &re) && re.Message == "No Destination Sets" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Destination
	for _, r := range res.Records {
		for _, t := range r.Set.Targets {
			d := Destination{Set: r.Set.ID, URI: t.Dest.URI, Flags: t.Dest.Flags,
				Priority: t.Dest.Priority, Weight: t.Dest.Attrs.Weight, RWeight: t.Dest.Attrs.RWeight}
			if t.Dest.Attrs.Body != nil {
				d.Attrs = *t.Dest.Attrs.Body
			}
			out = append(out, d)
		}
	}
	return out, nil
}

// Change is one set_state Sync issued.
type Change struct {
	Set  int
	URI  string
	From string // flags before
	To   State
}

// Sync brings the destinations named in desired (by URI, in every set that
// holds them) to their desired state, touching only those that differ, and
// re-reads the list to confirm. Destinations not in desired are left alone.
func (c *Client) Sync(ctx context.Context, desired map[string]State) ([]Change, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sync(ctx, desired)
}

func (c *Client) sync(ctx context.Context, desired map[string]State) ([]Change, error) {
	list, err := c.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("dispatcher sync: %w", err)
	}
	var changes []Change
	for _, uri := range sortedKeys(desired) {
		s := desired[uri]
		if s != Active && s != Disabled {
			return nil, fmt.Errorf("dispatcher sync: %s: invalid state %v", uri, s)
		}
		found := false
		for _, d := range list {
			if d.URI != uri {
				continue
			}
			found = true
			if !d.satisfies(s) {
				changes = append(changes, Change{Set: d.Set, URI: uri, From: d.Flags, To: s})
			}
		}
		if !found {
			return nil, fmt.Errorf("dispatcher sync: %s: %w", uri, ErrUnknownDestination)
		}
	}
	for _, ch := range changes {
		// set_state takes effect in shared memory at once: the next
		// ds_select_dst already sees it.
		if err := c.rpc.call(ctx, "dispatcher.set_state", nil, ch.To.rpcState(), ch.Set, ch.URI); err != nil {
			return changes, fmt.Errorf("dispatcher sync: set %d %s to %s: %w", ch.Set, ch.URI, ch.To, err)
		}
		c.log.Info("dispatcher state set", "set", ch.Set, "uri", ch.URI, "from_flags", ch.From, "to_state", ch.To.String())
	}
	if err := c.confirm(ctx, desired, nil); err != nil {
		return changes, fmt.Errorf("dispatcher sync: %w", err)
	}
	return changes, nil
}

// confirm re-reads the list and checks every desired state, and, when
// entries is given, every entry's priority and weight.
func (c *Client) confirm(ctx context.Context, desired map[string]State, entries []Entry) error {
	list, err := c.List(ctx)
	if err != nil {
		return fmt.Errorf("re-reading: %w", err)
	}
	var bad []string
	for _, d := range list {
		if s, ok := desired[d.URI]; ok && !d.satisfies(s) {
			bad = append(bad, fmt.Sprintf("set %d %s is %s, want %s", d.Set, d.URI, d.Flags, s))
		}
	}
	for _, e := range entries {
		i := slices.IndexFunc(list, func(d Destination) bool { return d.Set == e.Set && d.URI == e.URI })
		switch {
		case i < 0:
			bad = append(bad, fmt.Sprintf("set %d %s missing", e.Set, e.URI))
		case list[i].Priority != e.Priority || list[i].Weight != e.Weight || list[i].RWeight != e.Weight:
			bad = append(bad, fmt.Sprintf("set %d %s has priority %d weight %d rweight %d, want %d %d",
				e.Set, e.URI, list[i].Priority, list[i].Weight, list[i].RWeight, e.Priority, e.Weight))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrNotApplied, strings.Join(bad, "; "))
	}
	return nil
}

// Entry is one line of the dispatcher list file.
type Entry struct {
	Set      int
	URI      string
	State    State
	Priority int
	Weight   int    // written as weight=N;rweight=N; 0 leaves both out
	Attrs    string // further attributes, e.g. "duid=pbx-a"; must not contain weight
}

func (e Entry) line() (string, error) {
	if e.Set <= 0 || e.URI == "" || strings.ContainsAny(e.URI, " \t\n") {
		return "", fmt.Errorf("entry %d %q: set must be positive and uri non-empty without blanks", e.Set, e.URI)
	}
	if strings.Contains(e.Attrs, "weight=") || strings.ContainsAny(e.Attrs, " \t\n") {
		return "", fmt.Errorf("entry %s: attrs %q must not hold weight= or blanks", e.URI, e.Attrs)
	}
	flags := 8 // probing, so Kamailio keeps checking the node it may use
	switch e.State {
	case Active:
	case Disabled:
		flags = 4
	default:
		return "", fmt.Errorf("entry %s: invalid state %v", e.URI, e.State)
	}
	var attrs []string
	if e.Attrs != "" {
		attrs = append(attrs, e.Attrs)
	}
	if e.Weight > 0 {
		w := strconv.Itoa(e.Weight)
		attrs = append(attrs, "weight="+w, "rweight="+w)
	}
	l := fmt.Sprintf("%d %s %d %d", e.Set, e.URI, flags, e.Priority)
	if len(attrs) > 0 {
		l += " " + strings.Join(attrs, ";")
	}
	return l, nil
}

// ApplyList makes entries the whole dispatcher configuration: it writes the
// list file atomically (states encoded in the flags), reloads it, then
// re-applies and confirms states, priorities and weights. This is the only
// way to change weights and priorities at run time in Kamailio 5.6; see the
// package documentation for its cost.
func (c *Client) ApplyList(ctx context.Context, entries []Entry) error {
	if c.cfg.ListFile == "" {
		return ErrNoListFile
	}
	var b strings.Builder
	b.WriteString("# written by fan; changes here are overwritten\n")
	desired := make(map[string]State, len(entries))
	for _, e := range entries {
		l, err := e.line()
		if err != nil {
			return fmt.Errorf("dispatcher apply list: %w", err)
		}
		if prev, ok := desired[e.URI]; ok && prev != e.State {
			return fmt.Errorf("dispatcher apply list: %s has conflicting states in two sets", e.URI)
		}
		desired[e.URI] = e.State
		b.WriteString(l + "\n")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := durablefile.Write(c.cfg.ListFile, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("dispatcher apply list: %w", err)
	}
	if err := c.reload(ctx); err != nil {
		return fmt.Errorf("dispatcher apply list: %w", err)
	}
	// The file flags already carry the states; sync covers a node that was
	// changed over RPC between our write and the reload.
	if _, err := c.sync(ctx, desired); err != nil {
		return fmt.Errorf("dispatcher apply list: %w", err)
	}
	if err := c.confirm(ctx, desired, entries); err != nil {
		return fmt.Errorf("dispatcher apply list: %w", err)
	}
	c.log.Info("dispatcher list applied", "list_file", c.cfg.ListFile, "entries", len(entries))
	return nil
}

// reload calls dispatcher.reload, waiting out reload_delta.
func (c *Client) reload(ctx context.Context) error {
	for {
		err := c.rpc.call(ctx, "dispatcher.reload", nil)
		if !errors.Is(err, ErrReloadBusy) {
			return err
		}
		c.log.Debug("dispatcher reload rate-limited, retrying", "retry", c.cfg.ReloadRetry)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", err, ctx.Err())
		case <-time.After(c.cfg.ReloadRetry):
		}
	}
}

func sortedKeys(m map[string]State) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
