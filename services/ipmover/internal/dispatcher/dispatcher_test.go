package dispatcher

import (
	"errors"
	"fmt"
	"github.com/fanpbx/fan/pkg/platform/logtest"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/kamailio"
	"github.com/fanpbx/fan/lab/kamailio/kamailiotest"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

func testLog(t testing.TB, extra io.Writer) *slog.Logger {
	w := io.Discard
	if testing.Verbose() {
		w = t.Output()
	}
	if extra != nil {
		w = io.MultiWriter(w, extra)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lab struct {
	proxyPort int
	listFile  string
	proxy     *kamailiotest.Events
	client    *Client
}

// startLab starts the proxy with the given list file content and a client
// for it, and waits until its JSON-RPC answers.
func startLab(t *testing.T, list string, log *slog.Logger) *lab {
	t.Helper()
	l := &lab{proxyPort: porttest.Port(t), listFile: filepath.Join(t.TempDir(), "dispatcher.list")}
	if err := os.WriteFile(l.listFile, []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	l.proxy = kamailiotest.Start(t, "proxy", kamailio.ProxyConfig(l.proxyPort, l.listFile))
	c, err := New(Config{URL: fmt.Sprintf("http://127.0.0.1:%d/RPC", l.proxyPort), ListFile: l.listFile,
		Timeout: 2 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	l.client = c
	// Kamailio gives no readiness signal but its listening socket.
	waittest.Succeeds(t, 10*time.Second, "proxy JSON-RPC answering", func() error {
		_, err := c.List(t.Context())
		return err
	})
	return l
}

func flagsOf(t *testing.T, c *Client, uri string) string {
	t.Helper()
	list, err := c.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range list {
		if d.URI == uri {
			return d.Flags
		}
	}
	t.Fatalf("%s not in %+v", uri, list)
	return ""
}

// Calls flow to both nodes; after Sync sets A to d, new calls reach only B,
// and A stays disabled through probing cycles although it answers OPTIONS;
// after Sync sets A back to ap, calls reach A again.
func TestSyncSteersCalls(t *testing.T) {
	kamailiotest.Need(t, "kamailio", "sipp")
	portA, portB := freeUDPPortDistinct(t)
	uasA := kamailiotest.Start(t, "uas-a", kamailio.UASConfig("a", portA))
	uasB := kamailiotest.Start(t, "uas-b", kamailio.UASConfig("b", portB))
	uriA, uriB := fmt.Sprintf("sip:127.0.0.1:%d", portA), fmt.Sprintf("sip:127.0.0.1:%d", portB)
	l := startLab(t, fmt.Sprintf("1 %s 8 0 duid=a\n1 %s 8 0 duid=b\n", uriA, uriB), testLog(t, nil))
	ctx := t.Context()

	// Probing reaching both UASes means all three Kamailios are up.
	uasA.WaitFor(t, 10*time.Second, "OPTIONS probe at a", func() bool { return uasA.Count("OPTIONS a") > 0 })
	uasB.WaitFor(t, 10*time.Second, "OPTIONS probe at b", func() bool { return uasB.Count("OPTIONS b") > 0 })

	changes, err := l.client.Sync(ctx, map[string]State{uriA: Active, uriB: Active})
	if err != nil || len(changes) != 0 {
		t.Fatalf("sync of an already active pair: changes %+v, err %v; want none", changes, err)
	}
	a0, b0 := uasA.Count("INVITE a"), uasB.Count("INVITE b")
	if err := kamailiotest.SIPp(ctx, t, l.proxyPort, 10, 100); err != nil {
		t.Fatal(err)
	}
	a1, b1 := uasA.Count("INVITE a"), uasB.Count("INVITE b")
	if a1-a0 == 0 || b1-b0 == 0 || a1-a0+b1-b0 != 10 {
		t.Fatalf("both active: a got %d, b got %d of 10 calls; want both > 0", a1-a0, b1-b0)
	}

	// Under load, disable A and measure how long calls keep reaching it.
	// t.Context is cancelled before cleanups run, so a failing test kills
	// this background SIPp; the cleanup waits until it is gone.
	load, loadDone := make(chan error, 1), make(chan struct{})
	go func() { load <- kamailiotest.SIPp(ctx, t, l.proxyPort, 200, 100); close(loadDone) }()
	t.Cleanup(func() { <-loadDone })
	uasA.WaitFor(t, 10*time.Second, "calls at a under load", func() bool { return uasA.Count("INVITE a") >= a1+10 })
	tSet := time.Now()
	changes, err = l.client.Sync(ctx, map[string]State{uriA: Disabled, uriB: Active})
	tDone := time.Now()
	if err != nil || len(changes) != 1 || changes[0].URI != uriA || changes[0].To != Disabled {
		t.Fatalf("sync a=disabled: changes %+v, err %v; want exactly a set to d", changes, err)
	}
	if err := <-load; err != nil {
		t.Fatal(err)
	}
	invA := uasA.Times("INVITE a")
	var after int
	for _, at := range invA {
		if at.After(tDone) {
			after++
		}
	}
	t.Logf("set_state d: Sync (list+set_state+list) took %v; last INVITE at a %v after the Sync call started; %d INVITEs at a after Sync returned",
		tDone.Sub(tSet), invA[len(invA)-1].Sub(tSet), after)

	// Two more probe rounds at B prove probing ran while A stayed disabled.
	pb := uasB.Count("OPTIONS b")
	uasB.WaitFor(t, 10*time.Second, "two probe rounds", func() bool { return uasB.Count("OPTIONS b") >= pb+2 })
	if f := flagsOf(t, l.client, uriA); f != "DX" {
		t.Fatalf("a after probing rounds: flags %s, want DX (d must stick)", f)
	}
	a2, b2 := uasA.Count("INVITE a"), uasB.Count("INVITE b")
	if err := kamailiotest.SIPp(ctx, t, l.proxyPort, 10, 100); err != nil {
		t.Fatal(err)
	}
	if a, b := uasA.Count("INVITE a")-a2, uasB.Count("INVITE b")-b2; a != 0 || b != 10 {
		t.Fatalf("a disabled: a got %d, b got %d of 10 calls; want 0 and 10", a, b)
	}

	changes, err = l.client.Sync(ctx, map[string]State{uriA: Active})
	if err != nil || len(changes) != 1 || changes[0].From != "DX" {
		t.Fatalf("sync a=active: changes %+v, err %v", changes, err)
	}
	if f := flagsOf(t, l.client, uriA); f != "AP" {
		t.Fatalf("a after re-enable: flags %s, want AP", f)
	}
	a3 := uasA.Count("INVITE a")
	if err := kamailiotest.SIPp(ctx, t, l.proxyPort, 10, 100); err != nil {
		t.Fatal(err)
	}
	if uasA.Count("INVITE a") == a3 {
		t.Fatal("a re-enabled but received none of 10 calls")
	}

	_, err = l.client.Sync(ctx, map[string]State{uriA: Disabled, "sip:127.0.0.1:9": Disabled})
	if !errors.Is(err, ErrUnknownDestination) {
		t.Fatalf("sync with an unknown uri: err %v, want ErrUnknownDestination", err)
	}
	if f := flagsOf(t, l.client, uriA); f != "AP" {
		t.Fatalf("a changed by a rejected sync: flags %s", f)
	}
}

func freeUDPPortDistinct(t *testing.T) (int, int) {
	a := kamailiotest.FreeUDPPort(t)
	for {
		if b := kamailiotest.FreeUDPPort(t); b != a {
			return a, b
		}
	}
}

// ApplyList changes weights and priorities through the list file + reload,
// keeps a disabled node disabled across the reload, respects Kamailio's own
// verdict on a dead node, and waits out reload_delta.
func TestApplyList(t *testing.T) {
	kamailiotest.Need(t, "kamailio")
	logs := &logtest.Buffer{}
	// Nothing listens on these ports: Kamailio probes both down.
	uriA, uriB := fmt.Sprintf("sip:127.0.0.1:%d", kamailiotest.FreeUDPPort(t)), fmt.Sprintf("sip:127.0.0.1:%d", kamailiotest.FreeUDPPort(t))
	l := startLab(t, fmt.Sprintf("1 %s 8 0 weight=50\n1 %s 8 0 weight=50\n", uriA, uriB), testLog(t, logs))
	ctx := t.Context()

	// No event to wait on but the list itself.
	waittest.Succeeds(t, 10*time.Second, "kamailio probing the dead destination down", func() error {
		if f := flagsOf(t, l.client, uriA); !strings.HasPrefix(f, "I") && !strings.HasPrefix(f, "T") {
			return fmt.Errorf("flags %s", f)
		}
		return nil
	})
	changes, err := l.client.Sync(ctx, map[string]State{uriA: Active})
	if err != nil || len(changes) != 0 {
		t.Fatalf("sync active over a probed-down node: changes %+v err %v; want none (kamailio knows better)", changes, err)
	}
	if _, err := l.client.Sync(ctx, map[string]State{uriA: Disabled}); err != nil {
		t.Fatal(err)
	}

	entries := []Entry{
		{Set: 1, URI: uriA, State: Disabled, Priority: 5, Weight: 70, Attrs: "duid=a"},
		{Set: 1, URI: uriB, State: Active, Priority: 1, Weight: 30, Attrs: "duid=b"},
	}
	if err := l.client.ApplyList(ctx, entries); err != nil {
		t.Fatalf("apply list: %v", err)
	}
	check := func(wantWeightA, wantWeightB int) {
		t.Helper()
		list, err := l.client.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(list, func(x, y Destination) int { return strings.Compare(x.Attrs, y.Attrs) })
		if len(list) != 2 || list[0].URI != uriA || list[0].Flags != "DX" || list[0].Priority != 5 || list[0].Weight != wantWeightA ||
			list[1].URI != uriB || list[1].Disabled() || !list[1].Probing() || list[1].Priority != 1 || list[1].Weight != wantWeightB {
			t.Fatalf("list after apply = %+v", list)
		}
	}
	check(70, 30)
	file, err := os.ReadFile(l.listFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("1 %s 4 5 duid=a;weight=70;rweight=70\n", uriA); !strings.Contains(string(file), want) {
		t.Fatalf("list file lacks %q:\n%s", want, file)
	}

	// Right after a reload: Kamailio refuses for reload_delta (2 s here).
	entries[0].Weight, entries[1].Weight = 40, 60
	if err := l.client.ApplyList(ctx, entries); err != nil {
		t.Fatalf("second apply list: %v", err)
	}
	check(40, 60)
	if !strings.Contains(logs.String(), "rate-limited") {
		t.Fatal("second reload within reload_delta was not refused, so the retry path went untested")
	}

	if err := l.client.ApplyList(ctx, []Entry{{Set: 1, URI: uriA, State: Active, Attrs: "weight=3"}}); err == nil {
		t.Fatal("apply list accepted weight= inside attrs")
	}
	if err := (&Client{cfg: Config{}}).ApplyList(ctx, entries); !errors.Is(err, ErrNoListFile) {
		t.Fatalf("apply list without a list file: %v", err)
	}
}
