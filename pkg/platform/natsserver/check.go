package natsserver

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
)

// CheckHost checks what the settings name on this host, as -check-config
// does before fan-nats starts: the addresses it listens on, its store
// directory, and its server configuration file, read by nats-server's own
// parser, every TLS block's certificate, key and CA checked for what they
// are (config.KeyPairFiles, config.CAFile), and the listeners' security as
// Start enforces it. Keys are relative to prefix; errors in the server
// configuration file are placed on its own lines (config.Located). The
// listeners are judged only when Validate passes.
func (c *Config) CheckHost(prefix string) error {
	key := prefixed(prefix)
	var errs []error
	if c.Listen != "" {
		errs = append(errs, config.ListenLocal(key("listen"), c.Listen))
	}
	if c.Cluster.Listen != "" {
		errs = append(errs, config.ListenLocal(key("cluster.listen"), c.Cluster.Listen))
	}
	if st, err := os.Stat(c.StoreDir); err == nil && !st.IsDir() {
		errs = append(errs, config.Errf(key("store_dir"), "%s is not a directory", c.StoreDir))
	}
	if c.ServerConfig != "" {
		err := checkServerConfig(key("server_config"), c.ServerConfig)
		errs = append(errs, err)
		if refuses(err) {
			// The listeners cannot be judged without the file's
			// authorization and tls blocks.
			return config.Join(errs...)
		}
	}
	if c.Validate(prefix) != nil {
		// Validate names what is wrong; the options cannot be assembled.
		return config.Join(errs...)
	}
	opts, err := options(*c)
	if err != nil {
		return config.Join(append(errs, &config.FieldError{Key: key("server_config"), Err: err})...)
	}
	for _, err := range flattenJoin(checkListeners(opts, c.InsecureLab)) {
		k := key("listen")
		var le *listenerError
		if errors.As(err, &le) && le.route {
			k = key("cluster.listen")
		}
		errs = append(errs, &config.FieldError{Key: k, Err: err})
	}
	return config.Join(errs...)
}

// refuses reports whether checkServerConfig's result holds more than
// warnings.
func refuses(err error) bool {
	l, ok := err.(*config.Errors)
	if !ok {
		return err != nil
	}
	for _, it := range l.Items {
		if !it.Warning {
			return true
		}
	}
	return false
}

func flattenJoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// tlsFiles are the keys of a nats-server tls block that name files.
var tlsFiles = []string{"cert_file", "key_file", "ca_file"}

// checkServerConfig reads a nats-server configuration file with
// nats-server's parser and checks every file its tls blocks name. Errors
// come placed on the file's lines.
func checkServerConfig(key, path string) error {
	if err := config.FileReadable(key, path); err != nil {
		return err
	}
	var out config.Errors
	m, err := conf.ParseFileWithChecks(path)
	if err != nil {
		out.Items = append(out.Items, parseError(path, err))
		return &out
	}
	// The TLS blocks first: nats-server reports a missing or mismatched
	// file too, but only as the block's failure, in Go's words.
	refusedBlocks := map[string]bool{}
	for _, b := range findTLS(m, "") {
		errs, warns := b.check()
		out.Items = append(out.Items, append(errs, warns...)...)
		if len(errs) > 0 {
			refusedBlocks[b.where] = true
		}
	}
	var o server.Options
	if err := o.ProcessConfigFile(path); err != nil {
		var items []config.Located
		pe, ok := err.(interface {
			Errors() []error
			Warnings() []error
		})
		if !ok {
			items = append(items, parseError(path, err))
		} else {
			for _, e := range pe.Errors() {
				l := serverError(path, e)
				if !refusedBlocks[withoutColumn(l.Where)] {
					items = append(items, l)
				}
			}
			for _, w := range pe.Warnings() {
				l := serverError(path, w)
				l.Warning = true
				items = append(items, l)
			}
		}
		out.Items = append(out.Items, items...)
	}
	if len(out.Items) == 0 {
		return nil
	}
	// nats-server reports in the order of a map: put all in the file's.
	slices.SortStableFunc(out.Items, func(a, b config.Located) int { return compareWhere(a.Where, b.Where) })
	return &out
}

// tlsBlock is one tls { } of a nats-server configuration.
type tlsBlock struct {
	path  string // cluster.tls
	where string // file:line of the block
	files map[string]fileRef
}

type fileRef struct {
	value string
	where string
}

// token is what nats-server's parser (ParseFileWithChecks) wraps every
// value in.
type token interface {
	Value() any
	Line() int
	SourceFile() string
}

func at(t token) string { return t.SourceFile() + ":" + strconv.Itoa(t.Line()) }

// findTLS walks a parsed configuration for tls blocks (top level, cluster,
// gateway, leafnodes and their remotes, websocket, mqtt).
func findTLS(v any, path string) []tlsBlock {
	var out []tlsBlock
	var t token
	if tk, ok := v.(token); ok {
		t, v = tk, tk.Value()
	}
	switch v := v.(type) {
	case map[string]any:
		if t != nil && strings.EqualFold(path[strings.LastIndex(path, ".")+1:], "tls") {
			b := tlsBlock{path: path, where: at(t), files: map[string]fileRef{}}
			for k, fv := range v {
				ft, ok := fv.(token)
				if !ok {
					continue
				}
				if s, ok := ft.Value().(string); ok && slices.Contains(tlsFiles, strings.ToLower(k)) {
					b.files[strings.ToLower(k)] = fileRef{value: s, where: at(ft)}
				}
			}
			out = append(out, b)
		}
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			out = append(out, findTLS(v[k], p)...)
		}
	case []any:
		for i, e := range v {
			out = append(out, findTLS(e, fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return out
}

// check checks the block's files: errors and warnings, each placed on the
// line of the key that names the file.
func (b tlsBlock) check() (errs, warns []config.Located) {
	key := func(k string) string { return b.path + "." + k }
	cert, priv, ca := b.files["cert_file"], b.files["key_file"], b.files["ca_file"]
	var results []error
	results = append(results, config.KeyPairFiles(key("cert_file"), cert.value, key("key_file"), priv.value),
		config.CAFile(key("ca_file"), ca.value))
	for _, r := range results {
		for _, e := range flattenAll(r) {
			var fe *config.FieldError
			where := b.where
			if errors.As(e, &fe) {
				if f, ok := b.files[strings.TrimPrefix(fe.Key, b.path+".")]; ok {
					where = f.where
				}
				if fe.Warning {
					warns = append(warns, config.Located{Where: where, Err: e, Warning: true})
					continue
				}
			}
			errs = append(errs, config.Located{Where: where, Err: e})
		}
	}
	return errs, warns
}

func flattenAll(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenAll(e)...)
		}
		return out
	}
	return []error{err}
}

var parseLine = regexp.MustCompile(`^Parse error on line (\d+): `)

// parseError places a syntax error of nats-server's parser.
func parseError(path string, err error) config.Located {
	msg := err.Error()
	if m := parseLine.FindStringSubmatch(msg); m != nil {
		return config.Located{Where: path + ":" + m[1], Err: fmt.Errorf("not a valid nats-server configuration: %s", msg[len(m[0]):])}
	}
	return config.Located{Where: path, Err: fmt.Errorf("not a valid nats-server configuration: %s", msg)}
}

// serverError places one of nats-server's processing errors ("file:line:col:
// reason").
func serverError(path string, err error) config.Located {
	msg := err.Error()
	if s, ok := err.(interface{ Source() string }); ok {
		src := s.Source()
		return config.Located{Where: src, Err: errors.New(strings.TrimPrefix(msg, src+": "))}
	}
	if rest, ok := strings.CutPrefix(msg, path+": "); ok {
		return config.Located{Where: path, Err: errors.New(rest)}
	}
	return config.Located{Where: path, Err: err}
}

// withoutColumn turns file:line:col into file:line.
func withoutColumn(where string) string {
	parts := strings.Split(where, ":")
	if len(parts) >= 3 {
		return strings.Join(parts[:len(parts)-1], ":")
	}
	return where
}

// compareWhere orders file:line[:col] places by file, then line, then column.
func compareWhere(a, b string) int {
	pa, pb := strings.Split(a, ":"), strings.Split(b, ":")
	num := func(p []string, i int) int {
		if i < len(p) {
			n, _ := strconv.Atoi(p[i])
			return n
		}
		return 0
	}
	if c := strings.Compare(pa[0], pb[0]); c != 0 {
		return c
	}
	for i := 1; i < 3; i++ {
		if c := num(pa, i) - num(pb, i); c != 0 {
			return c
		}
	}
	return 0
}
