package cli

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// defaultURL is where a node listens when nothing says otherwise (`narad serve`'s
// default --http-addr).
const defaultURL = "http://127.0.0.1:7942"

// globals are the flags every command that talks to a broker takes.
type globals struct {
	urls         stringList
	user         string
	password     string
	passwordFile string
	context      string
	output       string
	timeout      time.Duration
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.Var(&g.urls, "url", "broker URL; repeat it or separate with commas to list several nodes for failover (env NARAD_URL)")
	fs.StringVar(&g.user, "user", "", "user name (env NARAD_USER)")
	fs.StringVar(&g.password, "password", "", "password (env NARAD_PASSWORD; prefer --password-file: flags show in ps)")
	fs.StringVar(&g.passwordFile, "password-file", "", "file whose first line is the password (env NARAD_PASSWORD_FILE)")
	fs.StringVar(&g.context, "context", "", "named context to use instead of the current one (env NARAD_CONTEXT)")
	fs.StringVar(&g.output, "output", "table", "table, json or raw")
	fs.StringVar(&g.output, "o", "table", "short for --output")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "deadline of each request to the broker (a long poll gets its wait on top)")
}

// stringList is a repeatable flag whose values may also be comma-separated.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

// env is one command's run: its IO, its flags, and the client it makes on first use.
type env struct {
	IO
	g    *globals
	path string
	c    *narad.Client
}

func (e *env) close() {
	if e.c != nil {
		_ = e.c.Close() // the command has its answer; closing idle connections cannot change it
	}
}

// format is the --output asked for, checked.
func (e *env) format() (string, error) {
	switch e.g.output {
	case "table", "json", "raw":
		return e.g.output, nil
	}
	return "", usagef("--output %q: want table, json or raw", e.g.output)
}

// target is where to connect and as whom, resolved from flags, then NARAD_*
// variables, then the named context, then the default URL.
type target struct {
	URLs           []string
	User, Password string
}

func (e *env) target() (target, error) {
	var t target
	ctxName := firstNonEmpty(e.g.context, e.Getenv("NARAD_CONTEXT"))
	var saved *savedContext
	store, err := loadContexts(e.Getenv)
	if err != nil {
		return t, err
	}
	if ctxName == "" {
		ctxName = store.Current
	}
	if ctxName != "" {
		c, ok := store.Contexts[ctxName]
		if !ok {
			return t, usagef("no context %q (narad context list shows them)", ctxName)
		}
		saved = &c
	}
	t.URLs = e.g.urls
	if len(t.URLs) == 0 {
		var l stringList
		_ = l.Set(e.Getenv("NARAD_URL"))
		t.URLs = l
	}
	ownNodes := len(t.URLs) == 0
	if ownNodes && saved != nil {
		t.URLs = saved.URLs
	}
	if len(t.URLs) == 0 {
		t.URLs = []string{defaultURL}
	}
	if err := noCredentialsIn(t.URLs); err != nil {
		return t, err
	}
	// A context's credentials go to its own nodes only: --url or NARAD_URL naming
	// another node (a test node, a typo, a host someone asked to be tried) is sent
	// none of them.
	var savedUser, savedPassword, savedFile string
	if saved != nil && (ownNodes || sameOrigins(t.URLs, saved.URLs)) {
		savedUser, savedPassword, savedFile = saved.User, saved.Password, saved.PasswordFile
	}
	t.User = firstNonEmpty(e.g.user, e.Getenv("NARAD_USER"), savedUser)
	if t.User != savedUser { // the saved password is the saved user's
		savedPassword, savedFile = "", ""
	}
	switch {
	case e.g.password != "":
		t.Password = e.g.password
	case e.g.passwordFile != "":
		return t, readPasswordFile(e.g.passwordFile, &t.Password)
	case e.Getenv("NARAD_PASSWORD") != "":
		t.Password = e.Getenv("NARAD_PASSWORD")
	case e.Getenv("NARAD_PASSWORD_FILE") != "":
		return t, readPasswordFile(e.Getenv("NARAD_PASSWORD_FILE"), &t.Password)
	case savedPassword != "":
		t.Password = savedPassword
	case savedFile != "":
		return t, readPasswordFile(savedFile, &t.Password)
	}
	return t, nil
}

// noCredentialsIn refuses a URL carrying a user or password: the SDK would send them,
// but its errors name the node by its URL, so the password would be printed with every
// failure (and a context file lists its URLs).
func noCredentialsIn(urls []string) error {
	for _, s := range urls {
		if u, err := url.Parse(s); err == nil && u.User != nil {
			return usagef("the URL %s carries credentials, which would show in errors: give the URL without them, and --user with --password-file (or NARAD_USER and NARAD_PASSWORD_FILE)", u.Redacted())
		}
	}
	return nil
}

func readPasswordFile(path string, out *string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the password file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	*out = strings.TrimRight(line, "\r")
	return nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// client returns the SDK client for this run, made on first use. Its retries are
// fewer than a service's (a person or a script is waiting), and a node that cannot be
// reached fails the command with exit code 5 within seconds.
func (e *env) client() (*narad.Client, error) {
	if e.c != nil {
		return e.c, nil
	}
	if e.g.timeout <= 0 {
		return nil, usagef("--timeout %v: want a deadline above 0, e.g. 30s", e.g.timeout)
	}
	t, err := e.target()
	if err != nil {
		return nil, err
	}
	opts := []narad.Option{
		narad.WithRequestTimeout(e.g.timeout),
		narad.WithUserAgent("narad-cli"),
		narad.WithRetry(narad.RetryPolicy{Attempts: 3}),
	}
	if t.User != "" || t.Password != "" {
		if t.User == "" {
			return nil, usagef("a password without a user: give --user (or NARAD_USER)")
		}
		opts = append(opts, narad.WithBasicAuth(t.User, t.Password))
	}
	c, err := narad.New(t.URLs, opts...)
	if err != nil {
		return nil, usagef("%v", err)
	}
	e.c = c
	return c, nil
}

// withClient is the common shape of a command: get the client, run f.
func (e *env) withClient(ctx context.Context, f func(*narad.Client) error) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	return f(c)
}

// sameOrigins reports whether every URL of urls has the scheme, host and port of one
// of the context's URLs (the default port of the scheme when none is written).
func sameOrigins(urls, context []string) bool {
	own := map[string]bool{}
	for _, u := range context {
		if o, ok := origin(u); ok {
			own[o] = true
		}
	}
	for _, u := range urls {
		if o, ok := origin(u); !ok || !own[o] {
			return false
		}
	}
	return true
}

func origin(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", false
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme + "://" + strings.ToLower(u.Hostname()) + ":" + port, true
}
