package fanctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// commandSpec is what help and shell completion know of a command besides
// its flags, which come from the command's own FlagSet (describe), so they
// cannot drift from what it parses.
//
// A new command: add its name to commands and its case to dispatch
// (fanctl.go), parse its flags first thing with parseFlags or
// parseInterspersed (+ wantArgs), return usagef(...) for a mistake in the
// command line, and register its spec from an init in its own file (as
// backup.go, site.go and doctor.go do):
//
//	func init() {
//		registerCommand(commandSpec{Name: "restore", Section: sectionInstall,
//			Synopsis: "[--replicas N] FILE", Summary: "make FAN_EVENTS again from a backup",
//			Examples: []string{"fanctl restore --replicas 3 FAN_EVENTS.snap"},
//			Args:     []argSpec{{Name: "FILE", Kind: kindFile}}})
//	}
//
// Help then prints its usage line, summary, flags and examples, usage
// errors exit 2 on one line, and completion offers its flags, completes
// files for the flags Values marks as files or directories (a test fails
// when a flag whose help says "file" or "directory" is not marked), and
// the nodes, groups or event types of the flags and arguments marked so.
type commandSpec struct {
	Name string
	// Section groups the command in fanctl help: "" (reading the bus and
	// general), sectionActions or sectionInstall.
	Section string
	// Synopsis is what follows the command's name on its usage line; a
	// line per alternative form.
	Synopsis string
	// Summary is one line: what the command does.
	Summary string
	// Examples are whole command lines as an operator types them; at
	// least one.
	Examples []string
	// Values says what the values of the command's flags are, for shell
	// completion: files, directories, nodes, groups, event types. A flag
	// not listed completes nothing.
	Values map[string]valueKind
	// Args are the positional arguments in order, for completion.
	Args []argSpec
	// More is printed after the flags in the command's help.
	More func() string
}

// Sections of fanctl help.
const (
	sectionActions = "operator actions"
	sectionInstall = "install"
)

// valueKind is what a flag's value or an argument is, for completion.
type valueKind string

const (
	kindFile    valueKind = "file"
	kindDir     valueKind = "dir"
	kindNode    valueKind = "node"    // a node of the cluster's groups (from the bus)
	kindGroup   valueKind = "group"   // a group of the cluster (from the bus)
	kindCluster valueKind = "cluster" // a cluster with group status (from the bus)
	kindType    valueKind = "type"    // an event type of pkg/events
	kindCommand valueKind = "command" // a fanctl command
)

// argSpec is one positional argument: fixed words or a kind of value.
type argSpec struct {
	Name  string
	Words []string
	Kind  valueKind
}

var specs = map[string]*commandSpec{}

// registerCommand records a command's help and completion data.
func registerCommand(s commandSpec) {
	if _, dup := specs[s.Name]; dup {
		panic("fanctl: command registered twice: " + s.Name)
	}
	specs[s.Name] = &s
}

// globalValues are the kinds of fanctl's own flags' values.
var globalValues = map[string]valueKind{
	"config": kindFile, "creds": kindFile, "nkey": kindFile, "tls-ca": kindFile, "tls-cert": kindFile, "tls-key": kindFile,
	"cluster": kindCluster,
}

func init() {
	actionFlags := map[string]valueKind{"group": kindGroup}
	for _, s := range []commandSpec{
		{Name: "events", Synopsis: "[--since 1h|TIME|all] [--follow] [--json] [--type TYPE] [--live]",
			Summary: "print the audit trail (--live: the live stream of heartbeats and probe results)",
			Examples: []string{"fanctl events --since 10m", "fanctl events --since all --type arbiter.decision --json",
				"fanctl --cluster prod events --follow", "fanctl events --live --since 5m --type node.heartbeat"},
			Values: map[string]valueKind{"type": kindType},
			More: func() string {
				var audit, live []string
				for _, t := range eventTypes() {
					if events.IsLive(events.Type(t)) {
						live = append(live, t)
					} else {
						audit = append(audit, t)
					}
				}
				return wrap("event types (--type): "+strings.Join(audit, ", "), "  ") + wrap("with --live: "+strings.Join(live, ", "), "  ") +
					"--json prints one JSON envelope per line (none when nothing matches).\n"
			}},
		{Name: "status", Synopsis: "[--json]", Summary: "who holds each group's addresses, and each node's health",
			Examples: []string{"fanctl --cluster prod status", "fanctl status --json | jq -r '.[] | [.group, .holder] | @tsv'"},
			More: func() string {
				return "--json prints a JSON array of the group status records ([] when there are none).\n"
			}},
		{Name: "explain", Synopsis: "EVENT_ID [--lookback 24h] [--json]",
			Summary:  "the causal chain of an event, back to the probe results",
			Examples: []string{"fanctl explain 0193a1b2-5c3d-7e4f-8a9b-0c1d2e3f4a5b", "fanctl explain \"$id\" --lookback 72h --json"},
			Args:     []argSpec{{Name: "EVENT_ID"}}},
		{Name: "windows", Synopsis: "[--json]", Summary: "the failback windows the scheduler will permit next",
			Examples: []string{"fanctl --cluster prod windows", "fanctl windows --json"},
			More: func() string {
				return "--json prints a JSON array of the scheduler's plans ([] when none is published).\n"
			}},
		{Name: "replay", Synopsis: "--arbiter-config FILE [--since 24h|TIME|all] [--until TIME] [--tolerance 1s]",
			Summary: "replay the arbiter's decisions through its decision core and compare each with the one recorded (exit 4 on a difference)",
			Examples: []string{"fanctl replay --arbiter-config /etc/fan/arbiter.yaml --since 24h",
				"fanctl replay --arbiter-config changed-policy.yaml --since 2026-11-30T02:00:00Z --until 2026-11-30T03:00:00Z"},
			Values: map[string]valueKind{"arbiter-config": kindFile}},
		{Name: "serve", Synopsis: "[--listen 127.0.0.1:9110] [--path-prefix /] [--token-file FILE]",
			Summary:  "the live status page (the serve: section of --config; cmd/README.md)",
			Examples: []string{"fanctl --config /etc/fan/bus/fanctl.yaml serve --token-file /etc/fan/page.token"},
			Values:   map[string]valueKind{"token-file": kindFile}},
		{Name: "switchover", Section: sectionActions,
			Synopsis: "--to NODE [--group G] [--reason TEXT] [--as COMMENT] [--within D] [--force-after | --now] [--for D | --until TIME] [--json]\n" +
				"--cancel [--group G] [--reason TEXT] [--as COMMENT] [--json]\n" +
				"--clear [--group G] [--reason TEXT] [--as COMMENT] [--json]",
			Summary: "move a group to NODE once the holder's calls have ended, and pin it there (--cancel: the planned switchover still waiting; --clear: the pin)",
			Examples: []string{"fanctl switchover --to n2 --reason \"kernel update on n1\"",
				"fanctl switchover --to n2 --group pbx --within 45m --force-after --for 2h", "fanctl switchover --cancel --group pbx",
				"fanctl switchover --clear --group pbx --reason \"n1 upgraded\""},
			More: func() string {
				return wrap("The pin keeps automatic failback from moving the group off NODE, whatever window is open; a failover still "+
					"moves it, and ends the pin. It lasts until --clear, another switchover, its --for (from the move) or --until. "+
					"A switchover --to the node that already holds the group moves nothing: with --for or --until it pins the group "+
					"there from now, replacing the pin in force (how a pin about to end is renewed).", "")
			},
			Values: map[string]valueKind{"to": kindNode, "group": kindGroup}},
		{Name: "failback", Section: sectionActions, Synopsis: "--now --reason TEXT [--group G] [--as COMMENT] [--json]",
			Summary:  "fail back to the preferred node now, outside any window",
			Examples: []string{"fanctl failback --now --reason \"customer asked\" --group pbx"},
			Values:   actionFlags},
		{Name: "maintenance", Section: sectionActions, Synopsis: "on|off [--group G] [--reason TEXT] [--as COMMENT] [--json]",
			Summary:  "freeze (on) or unfreeze (off) automatic moves; no --group: the whole cluster",
			Examples: []string{"fanctl maintenance on --group pbx --reason \"work on the PBX hosts\"", "fanctl maintenance off --reason \"work finished\""},
			Values:   actionFlags,
			Args:     []argSpec{{Name: "on|off", Words: []string{"on", "off"}}}},
		{Name: "node", Section: sectionActions,
			Synopsis: "standby NODE [--reason TEXT] [--as COMMENT] [--within D] [--force-after | --now] [--json]\n" +
				"active NODE [--reason TEXT] [--as COMMENT] [--json]",
			Summary: "take a node out of service once its calls have ended (standby), or back in (active, which also cancels a standby's waits)",
			Examples: []string{"fanctl node standby n1 --within 45m --reason \"disk swap\"",
				"fanctl node active n1 --reason \"disk swapped\""},
			Args: []argSpec{{Name: "standby|active", Words: []string{"standby", "active"}}, {Name: "NODE", Kind: kindNode}}},
		{Name: "nats-config", Section: sectionInstall, Synopsis: "--cluster-file FILE --out DIR [--renew]",
			Summary:  "the bus's CA, certificates, nkeys, nats-server configurations and per-host bundles",
			Examples: []string{"fanctl nats-config --cluster-file cluster.yaml --out fan-bus", "fanctl nats-config --cluster-file cluster.yaml --out fan-bus --renew"},
			Values:   map[string]valueKind{"cluster-file": kindFile, "out": kindDir}},
		{Name: "provision", Section: sectionInstall,
			Synopsis: "[--replicas 3] [--events-max-age 2160h] [--events-mib 512] [--live-mib 128] [--live-max-age 6h] " +
				"[--commands-mib 64] [--state-mib 32] [--wait 1m]",
			Summary:  "create fan's streams, bucket and object stores (with the admin's bundle)",
			Examples: []string{"fanctl --config fan-bus/hosts/admin/fanctl.yaml provision --replicas 3", "fanctl --url nats://127.0.0.1:4222 provision --replicas 1"}},
		{Name: "help", Synopsis: "[COMMAND]", Summary: "this text, or a command's flags and examples (also COMMAND -h)",
			Examples: []string{"fanctl help", "fanctl help switchover"}, Args: []argSpec{{Name: "COMMAND", Kind: kindCommand}}},
		{Name: "version", Summary: "fanctl's version (also --version)", Examples: []string{"fanctl version"}},
		{Name: "completion", Synopsis: "bash|zsh", Summary: "a shell completion script",
			Examples: []string{"source <(fanctl completion bash)", "fanctl completion zsh > \"${fpath[1]}/_fanctl\""},
			Args:     []argSpec{{Name: "bash|zsh", Words: []string{"bash", "zsh"}}}},
	} {
		registerCommand(s)
	}
}

// eventTypes lists every event type pkg/events defines, sorted.
func eventTypes() []string {
	var out []string
	for _, t := range events.Types() {
		out = append(out, string(t))
	}
	sort.Strings(out)
	return out
}

// isCommand: name is one of fanctl's commands.
func isCommand(name string) bool { return slices.Contains(commands, name) }

// describe runs a command's flag parsing alone (with -h, nothing else
// happens) and returns its flags: nil for a command that defines none.
func describe(cmd string) *flag.FlagSet {
	if !isCommand(cmd) {
		return nil
	}
	noBus := func(...string) (*bus.Bus, error) { return nil, errors.New("describing a command: no bus") }
	inv := &invocation{ctx: context.Background(), bounded: context.Background(), cfg: &bus.Config{}, connect: noBus,
		stdout: io.Discard, stderr: io.Discard}
	var h *helpRequested
	if errors.As(dispatch(inv, cmd, []string{"-h"}), &h) {
		return h.fs
	}
	return nil
}

const helpIntro = `usage: fanctl [global flags] COMMAND [arguments and flags]
The global flags may come before or after the command. fanctl help COMMAND
(or fanctl COMMAND -h) shows a command's flags and examples.
`

var sectionIntro = map[string]string{
	"": "commands:",
	sectionActions: `operator actions (need --cluster and --operator, or a --config naming both;
each is recorded as the operator whose credentials sent it; --as adds a comment;
--json prints the arbiter's answer as JSON; --group, --to and NODE must name a
group or node of the cluster's status):`,
	sectionInstall: "install (deploy/systemd/README.md):",
}

const helpOutro = `a switchover or standby waits until the holder's calls have ended (at most the group's
drain limit of active channels), up to --within (the group's planned.drain_within, 30m by
default), then gives up, or with --force-after moves anyway; --now moves at once.

--timeout bounds each command that talks to the bus as a whole (connecting and every
read). What waits on purpose has its own bound: events --follow reads until interrupted
once connected, serve runs until stopped, an action waits --wait for the arbiter's answer
and provision --wait for JetStream's leaders. A bus without fan's streams (nobody ran
fanctl provision) fails at once, saying so.

--json always prints JSON: [] when there is nothing (events: one envelope per line).

exit status: 0 done; 1 failed (the bus, a file, the arbiter unreachable); 2 usage error:
a bad flag or argument, or a node, group or event type that does not exist (one line on
standard error, before anything is sent); 3 the arbiter refused the action; 4 replay
found a decision that differs from the recorded one

global flags:
`

// printUsage writes fanctl help: every command by section, then the
// global flags.
func printUsage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprint(w, helpIntro)
	for _, section := range []string{"", sectionActions, sectionInstall} {
		fmt.Fprintf(w, "\n%s\n", sectionIntro[section])
		for _, name := range commands {
			s := specs[name]
			if s == nil {
				s = &commandSpec{Name: name}
			}
			if s.Section != section {
				continue
			}
			for _, line := range strings.Split(s.Synopsis, "\n") {
				fmt.Fprintf(w, "  %s\n", strings.TrimSpace(name+" "+line))
			}
			if s.Summary != "" {
				fmt.Fprintf(w, "        %s\n", s.Summary)
			}
		}
	}
	fmt.Fprint(w, "\n"+helpOutro)
	printDefaults(w, global)
}

// printCommandHelp writes a command's help: its usage lines, summary,
// flags (from its FlagSet), what else it says and its examples.
func printCommandHelp(w io.Writer, cmd string) {
	s := specs[cmd]
	if s == nil {
		s = &commandSpec{Name: cmd, Synopsis: "[flags]"}
	}
	for i, line := range strings.Split(s.Synopsis, "\n") {
		lead := "usage:"
		if i > 0 {
			lead = "      "
		}
		fmt.Fprintf(w, "%s %s\n", lead, strings.TrimSpace("fanctl [global flags] "+cmd+" "+line))
	}
	if s.Summary != "" {
		fmt.Fprintf(w, "\n%s\n", s.Summary)
	}
	if fs := describe(cmd); fs != nil {
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprint(w, "\nflags:\n")
			printDefaults(w, fs)
		}
	}
	if s.More != nil {
		fmt.Fprint(w, "\n"+s.More())
	}
	if len(s.Examples) > 0 {
		fmt.Fprint(w, "\nexamples:\n")
		for _, e := range s.Examples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	fmt.Fprint(w, "\nglobal flags (--config, --url, --cluster, --operator, --timeout, ...): fanctl help\n")
}

func printDefaults(w io.Writer, fs *flag.FlagSet) {
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}

// wrap breaks text into lines of at most 90 characters, the later ones
// indented.
func wrap(text, indent string) string {
	var b strings.Builder
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > 90 {
			b.WriteString(line + "\n")
			line = indent + w
			continue
		}
		if line != "" && line != indent {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
	return b.String()
}

// wantsHelp: args ask for the command's help (-h, --help) before any --.
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "--h", "-help", "--help":
			return true
		}
	}
	return false
}
