package fanctl

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// commandFlags lists each command's own flags for shell completion; a test
// compares it with what each command's -h prints, so it cannot drift.
var commandFlags = map[string][]string{
	"events":      {"since", "follow", "json", "type", "live"},
	"status":      {"json"},
	"explain":     {"lookback", "json"},
	"windows":     {"json"},
	"replay":      {"arbiter-config", "since", "until", "tolerance"},
	"serve":       {"listen", "path-prefix", "token-file"},
	"switchover":  {"to", "cancel", "group", "reason", "as", "wait", "json", "within", "force-after", "now"},
	"failback":    {"now", "group", "reason", "as", "wait", "json"},
	"maintenance": {"group", "reason", "as", "wait", "json"},
	"node":        {"reason", "as", "wait", "json", "within", "force-after", "now"},
	"nats-config": {"cluster-file", "out", "renew"},
	"provision":   {"replicas", "events-max-age", "events-mib", "live-mib", "live-max-age", "commands-mib", "state-mib", "wait"},
}

// commandWords are the fixed words a command takes after its name.
var commandWords = map[string][]string{
	"maintenance": {"on", "off"},
	"node":        {"standby", "active"},
	"completion":  {"bash", "zsh"},
	"help":        commands,
}

func runCompletion(args []string, global *flag.FlagSet, w io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: fanctl completion bash|zsh")
	}
	var gflags []string
	global.VisitAll(func(f *flag.Flag) { gflags = append(gflags, "--"+f.Name) })
	sort.Strings(gflags)
	cases := func(pattern, indent string) string {
		names := make([]string, 0, len(commands))
		names = append(names, commands...)
		sort.Strings(names)
		var b strings.Builder
		for _, c := range names {
			var words []string
			for _, f := range commandFlags[c] {
				words = append(words, "--"+f)
			}
			words = append(words, commandWords[c]...)
			if len(words) == 0 {
				continue
			}
			fmt.Fprintf(&b, pattern, indent, c, strings.Join(words, " "))
		}
		return b.String()
	}
	switch args[0] {
	case "bash":
		fmt.Fprintf(w, bashCompletion, strings.Join(commands, " "), strings.Join(gflags, " "),
			cases("%s%s) words=\"%s\" ;;\n", "\t\t"))
	case "zsh":
		fmt.Fprintf(w, zshCompletion, strings.Join(commands, " "), strings.Join(gflags, " "),
			cases("%s%s) candidates=(%s) ;;\n", "\t\t"))
	default:
		return fmt.Errorf("completion %q: want bash or zsh", args[0])
	}
	return nil
}

// The scripts find the command as the first word that is neither a flag
// nor a global flag's value, complete commands before it and that
// command's flags and words after it; global flags complete everywhere.
const bashCompletion = `# bash completion for fanctl: source <(fanctl completion bash)
_fanctl() {
	local cur=${COMP_WORDS[COMP_CWORD]} cmd="" i w
	local commands="%s"
	local globals="%s"
	for ((i = 1; i < COMP_CWORD; i++)); do
		w=${COMP_WORDS[i]}
		case $w in
		-*) ;;
		*) case ${COMP_WORDS[i-1]} in --url|--creds|--nkey|--tls-ca|--tls-cert|--tls-key|--cluster|--operator|--config|--timeout) ;; *) cmd=$w; break ;; esac ;;
		esac
	done
	local words=""
	case $cmd in
	"") words=$commands ;;
%s	esac
	COMPREPLY=($(compgen -W "$words $globals" -- "$cur"))
}
complete -F _fanctl fanctl
`

const zshCompletion = `#compdef fanctl
# zsh completion for fanctl: fanctl completion zsh > "${fpath[1]}/_fanctl"
_fanctl() {
	local -a commands globals candidates
	local cmd="" i
	commands=(%s)
	globals=(%s)
	for ((i = 2; i < CURRENT; i++)); do
		case ${words[i]} in
		-*) ;;
		*) case ${words[i-1]} in --url|--creds|--nkey|--tls-ca|--tls-cert|--tls-key|--cluster|--operator|--config|--timeout) ;; *) cmd=${words[i]}; break ;; esac ;;
		esac
	done
	case $cmd in
	"") candidates=($commands) ;;
%s	esac
	compadd -- $candidates $globals
}
compdef _fanctl fanctl
`
