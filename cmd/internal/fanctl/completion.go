package fanctl

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// completeCommand is the hidden command the completion scripts call for
// the names only the bus knows (nodes, groups, clusters), with a short
// --timeout; it prints one name a line, and nothing when the bus cannot be
// reached.
const completeCommand = "__complete"

// completeTimeout is the --timeout the scripts give completeCommand: a
// shell waits for it on every TAB.
const completeTimeout = "1s"

// flagInfo is one flag as completion sees it.
type flagInfo struct {
	name   string
	kind   valueKind // what its value completes to; "value" for anything else
	isBool bool
}

func flagsOf(fs *flag.FlagSet, kinds map[string]valueKind) []flagInfo {
	var out []flagInfo
	fs.VisitAll(func(f *flag.Flag) {
		fi := flagInfo{name: f.Name, kind: kinds[f.Name]}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			fi.isBool = true
		} else if fi.kind == "" {
			fi.kind = "value"
		}
		out = append(out, fi)
	})
	return out
}

// commandFlags is every command's flags, from its FlagSet (describe).
func commandFlags() map[string][]flagInfo {
	out := map[string][]flagInfo{}
	for _, c := range commands {
		if fs := describe(c); fs != nil {
			var kinds map[string]valueKind
			if s := specs[c]; s != nil {
				kinds = s.Values
			}
			out[c] = flagsOf(fs, kinds)
		}
	}
	return out
}

// visibleCommands are the commands completion offers, sorted.
func visibleCommands() []string {
	out := slices.Clone(commands)
	sort.Strings(out)
	return out
}

func runCompletion(args []string, global *flag.FlagSet, w io.Writer) error {
	if err := wantArgs(args, "bash|zsh"); err != nil {
		return err
	}
	if args[0] != "bash" && args[0] != "zsh" {
		return usagef("completion %q: want bash or zsh", args[0])
	}
	globals := flagsOf(global, globalValues)
	perCommand := commandFlags()
	names := visibleCommands()

	var valueCases, flagCases, argCases, globalNames, globalWords strings.Builder
	for _, c := range names {
		var words []string
		for _, f := range perCommand[c] {
			words = append(words, "--"+f.name)
			if !f.isBool {
				fmt.Fprintf(&valueCases, "\t%s:%s) echo %s ;;\n", c, f.name, f.kind)
			}
		}
		if len(words) > 0 {
			fmt.Fprintf(&flagCases, "\t%s) echo '%s' ;;\n", c, strings.Join(words, " "))
		}
		if s := specs[c]; s != nil {
			for i, a := range s.Args {
				switch {
				case len(a.Words) > 0:
					fmt.Fprintf(&argCases, "\t%s:%d) echo 'words %s' ;;\n", c, i, strings.Join(a.Words, " "))
				case a.Kind != "":
					fmt.Fprintf(&argCases, "\t%s:%d) echo %s ;;\n", c, i, a.Kind)
				}
			}
		}
	}
	var gnames []string
	for _, f := range globals {
		gnames = append(gnames, f.name)
		fmt.Fprintf(&globalWords, " --%s", f.name)
		if !f.isBool {
			fmt.Fprintf(&valueCases, "\t*:%s) echo %s ;;\n", f.name, f.kind)
		}
	}
	globalNames.WriteString(strings.Join(gnames, "|"))
	tables := fmt.Sprintf(scriptTables, strings.Join(names, " "), strings.TrimSpace(globalWords.String()),
		strings.Join(eventTypes(), " "), valueCases.String(), globalNames.String(), flagCases.String(), argCases.String(), completeTimeout, completeCommand)
	switch args[0] {
	case "bash":
		fmt.Fprint(w, bashHeader+tables+bashCompletion)
	case "zsh":
		fmt.Fprint(w, zshHeader+tables+zshCompletion)
	}
	return nil
}

// runComplete is completeCommand: the names of kind the bus knows, one a
// line (the cluster's with --cluster, every cluster's without).
func runComplete(inv *invocation, args []string) error {
	if err := wantArgs(args, "node|group|cluster|type"); err != nil {
		return err
	}
	var names []string
	switch kind := valueKind(args[0]); kind {
	case kindType:
		names = eventTypes()
	case kindNode, kindGroup, kindCluster:
		b, err := inv.connect(bus.StateBucket)
		if err != nil {
			return err
		}
		defer b.Close()
		records, err := view.Records[events.GroupStatus](inv.bounded, b, view.StatusFilter(inv.cluster))
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, r := range records {
			var found []string
			switch kind {
			case kindNode:
				for n := range r.Value.Nodes {
					found = append(found, n)
				}
			case kindGroup:
				found = []string{r.Value.Group}
			case kindCluster:
				found = []string{view.ClusterOfKey(r.Key)}
			}
			for _, n := range found {
				if n != "" && !seen[n] {
					seen[n] = true
					names = append(names, n)
				}
			}
		}
		sort.Strings(names)
	default:
		return usagef("%s %q: want node, group, cluster or type", completeCommand, kind)
	}
	for _, n := range names {
		fmt.Fprintln(inv.stdout, n)
	}
	return nil
}

const bashHeader = `# bash completion for fanctl: source <(fanctl completion bash), or install it
# as /usr/share/bash-completion/completions/fanctl (the Debian package does).
# Commands, flags, fixed words and event types complete from this script;
# files for the flags that take one; nodes, groups and clusters from the bus
# when fanctl reaches it within a second (with the connection flags on the
# line), and nothing otherwise.
`

const zshHeader = `#compdef fanctl
# zsh completion for fanctl: fanctl completion zsh > "${fpath[1]}/_fanctl"
# (then compinit), or source <(fanctl completion zsh) after compinit; the
# Debian package installs it as /usr/share/zsh/vendor-completions/_fanctl.
# Commands, flags, fixed words and event types complete from this script;
# files for the flags that take one; nodes, groups and clusters from the bus
# when fanctl reaches it within a second (with the connection flags on the
# line), and nothing otherwise.
`

// scriptTables is what both shells share: the words and, as case
// statements both understand, what each flag's value and each argument is.
const scriptTables = `_fanctl_commands='%s'
_fanctl_globals='%s'
_fanctl_types='%s'

# _fanctl_value COMMAND FLAG: what FLAG (no dashes) takes after COMMAND
# (file, dir, node, group, cluster, type or value); nothing for a switch.
_fanctl_value() {
	case ${1}:${2} in
%s	esac
}

# _fanctl_global FLAG: FLAG (no dashes) is fanctl's own, which the bus
# lookups pass on.
_fanctl_global() {
	case $1 in
	%s) return 0 ;;
	esac
	return 1
}

# _fanctl_flags COMMAND: the command's own flags.
_fanctl_flags() {
	case $1 in
%s	esac
}

# _fanctl_arg COMMAND N: what its argument N (from 0) is: "words W...",
# or a kind of value; nothing when it takes no more.
_fanctl_arg() {
	case ${1}:${2} in
%s	esac
}

# _fanctl_words KIND PROG [CONNECTION FLAGS...]: the candidates of a kind.
_fanctl_words() {
	local kind=$1 prog=$2
	shift 2
	case $kind in
	type) echo "$_fanctl_types" ;;
	command) echo "$_fanctl_commands" ;;
	node | group | cluster) "$prog" "$@" --timeout %s %s "$kind" 2>/dev/null ;;
	esac
}
`

// The scripts walk the words before the cursor: the first that is neither
// a flag nor a flag's value is the command, the rest its arguments; the
// connection flags are kept for the bus lookups. Then they complete a
// flag's value, or a command, or the command's next argument with its
// flags and the global ones.
const bashCompletion = `
_fanctl_complete() { # KIND CUR PROG [CONNECTION FLAGS...]
	local kind=$1 cur=$2
	shift 2
	case $kind in
	file)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -f -- "$cur")
		;;
	dir)
		compopt -o filenames 2>/dev/null
		mapfile -t COMPREPLY < <(compgen -d -- "$cur")
		;;
	*) mapfile -t COMPREPLY < <(compgen -W "$(_fanctl_words "$kind" "$@")" -- "$cur") ;;
	esac
}

_fanctl() {
	local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]} cmd="" w name kind value i n=0 flag=""
	local -a conn=()
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		case $w in
		-?*)
			name=${w#-}
			name=${name#-}
			name=${name%%=*}
			kind=$(_fanctl_value "$cmd" "$name")
			if [[ $w == *=* || -z $kind ]]; then
				if _fanctl_global "$name"; then conn+=("$w"); fi
				continue
			fi
			# The value is the next word, after a lone "=" when bash split --flag=value.
			if [[ ${COMP_WORDS[i+1]} == "=" ]]; then i=$((i + 1)); fi
			i=$((i + 1))
			if ((i < COMP_CWORD)) && _fanctl_global "$name"; then
				value=${COMP_WORDS[i]}
				if [[ $value == "~/"* ]]; then value=$HOME/${value#"~/"}; fi
				conn+=("--$name=$value")
			fi
			;;
		*)
			if [[ -z $cmd ]]; then cmd=$w; else n=$((n + 1)); fi
			;;
		esac
	done
	local prev=${COMP_WORDS[COMP_CWORD-1]}
	if [[ $prev == "=" ]] && ((COMP_CWORD >= 2)); then
		flag=${COMP_WORDS[COMP_CWORD-2]}
	elif ((COMP_CWORD >= 2)) && [[ $prev == -?* && $prev != *=* ]]; then
		flag=$prev
	fi
	if [[ -n $flag ]]; then
		name=${flag#-}
		name=${name#-}
		kind=$(_fanctl_value "$cmd" "$name")
		if [[ -n $kind ]]; then
			_fanctl_complete "$kind" "$cur" "$prog" "${conn[@]}"
			return
		fi
	fi
	local words="" spec
	if [[ $cur != -* ]]; then
		if [[ -z $cmd ]]; then
			words=$_fanctl_commands
		else
			spec=$(_fanctl_arg "$cmd" "$n")
			case $spec in
			"") ;;
			"words "*) words=${spec#words } ;;
			file | dir)
				_fanctl_complete "$spec" "$cur" "$prog" "${conn[@]}"
				return
				;;
			*) words=$(_fanctl_words "$spec" "$prog" "${conn[@]}") ;;
			esac
		fi
	fi
	if [[ -z $cur || $cur == -* ]]; then
		if [[ -n $cmd ]]; then words="$words $(_fanctl_flags "$cmd")"; fi
		words="$words $_fanctl_globals"
	fi
	mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
}
complete -F _fanctl fanctl
`

const zshCompletion = `
_fanctl_complete() { # KIND PROG [CONNECTION FLAGS...]
	local kind=$1
	shift
	case $kind in
	file) _files ;;
	dir) _files -/ ;;
	value) ;;
	*)
		local out
		out=$(_fanctl_words "$kind" "$@")
		compadd -- ${=out}
		;;
	esac
}

_fanctl() {
	local cur=${words[CURRENT]} prog=${words[1]} cmd="" w name kind value i n=0 flag="" spec cands=""
	local -a conn
	for ((i = 2; i < CURRENT; i++)); do
		w=${words[i]}
		case $w in
		-?*)
			name=${w#-}
			name=${name#-}
			name=${name%%=*}
			kind=$(_fanctl_value "$cmd" "$name")
			if [[ $w == *=* || -z $kind ]]; then
				if _fanctl_global "$name"; then conn+=("$w"); fi
				continue
			fi
			i=$((i + 1))
			if ((i < CURRENT)) && _fanctl_global "$name"; then
				value=${words[i]}
				if [[ $value == "~/"* ]]; then value=$HOME/${value#"~/"}; fi
				conn+=("--$name=$value")
			fi
			;;
		*)
			if [[ -z $cmd ]]; then cmd=$w; else n=$((n + 1)); fi
			;;
		esac
	done
	if [[ $cur == -?*=* ]]; then
		flag=${cur%%=*}
		compset -P '*='
	elif ((CURRENT > 2)) && [[ ${words[CURRENT-1]} == -?* && ${words[CURRENT-1]} != *=* ]]; then
		flag=${words[CURRENT-1]}
	fi
	if [[ -n $flag ]]; then
		name=${flag#-}
		name=${name#-}
		kind=$(_fanctl_value "$cmd" "$name")
		if [[ -n $kind ]]; then
			_fanctl_complete "$kind" "$prog" "${conn[@]}"
			return
		fi
	fi
	if [[ $cur != -* ]]; then
		if [[ -z $cmd ]]; then
			cands=$_fanctl_commands
		else
			spec=$(_fanctl_arg "$cmd" "$n")
			case $spec in
			"") ;;
			"words "*) cands=${spec#words } ;;
			file | dir)
				_fanctl_complete "$spec" "$prog" "${conn[@]}"
				return
				;;
			*) cands=$(_fanctl_words "$spec" "$prog" "${conn[@]}") ;;
			esac
		fi
	fi
	if [[ -z $cur || $cur == -* ]]; then
		if [[ -n $cmd ]]; then cands="$cands $(_fanctl_flags "$cmd")"; fi
		cands="$cands $_fanctl_globals"
	fi
	compadd -- ${=cands}
}

if [[ ${funcstack[1]} == _fanctl ]]; then
	# Autoloaded from fpath: this file is _fanctl's body; complete now.
	_fanctl "$@"
else
	compdef _fanctl fanctl
fi
`
