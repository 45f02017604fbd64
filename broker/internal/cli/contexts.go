package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
)

// savedContext is a named broker to talk to and the credentials to use there.
type savedContext struct {
	URLs         []string `json:"urls"`
	User         string   `json:"user,omitempty"`
	Password     string   `json:"password,omitempty"`
	PasswordFile string   `json:"password_file,omitempty"`
}

// contextStore is the contexts file. It may hold passwords, so it is written with mode
// 0600 in a 0700 directory, and replaced atomically (a crash leaves the old or the new
// file, never half of one).
type contextStore struct {
	Current  string                  `json:"current,omitempty"`
	Contexts map[string]savedContext `json:"contexts"`
}

// contextsPath is $NARAD_CLI_CONFIG, else narad/contexts.json in the user's config
// directory ($XDG_CONFIG_HOME or ~/.config on Linux).
func contextsPath(getenv func(string) string) (string, error) {
	if p := getenv("NARAD_CLI_CONFIG"); p != "" {
		return p, nil
	}
	dir := getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			d, err := os.UserConfigDir()
			if err != nil {
				return "", fmt.Errorf("no place for the contexts file (set NARAD_CLI_CONFIG): %w", err)
			}
			return filepath.Join(d, "narad", "contexts.json"), nil
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "narad", "contexts.json"), nil
}

// loadContexts reads the contexts file; a missing file is an empty store.
func loadContexts(getenv func(string) string) (*contextStore, error) {
	s := &contextStore{Contexts: map[string]savedContext{}}
	p, err := contextsPath(getenv)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the contexts file: %w", err)
	}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("the contexts file %s is not valid (fix or remove it): %w", p, err)
	}
	if s.Contexts == nil {
		s.Contexts = map[string]savedContext{}
	}
	return s, nil
}

func saveContexts(getenv func(string) string, s *contextStore) error {
	p, err := contextsPath(getenv)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".contexts-*.json")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }() // gone already after the rename
	if err := f.Chmod(0o600); err != nil {
		_ = f.Close() // the error above is the one to report
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		_ = f.Close() // the error above is the one to report
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the error above is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

// contextCommands are `narad context ...`. They work on the local file only and take
// no connection flags but --output.
func contextCommands() []*command {
	return []*command{
		{name: "add", usage: "NAME --url URL [--user U] [--password-file F | --password P] [--use]", args: 1, local: true,
			summary: "save a named context (replacing one of the same name)",
			setup: func(fs *flag.FlagSet) runFunc {
				var urls stringList
				var user, password, passwordFile string
				var use bool
				fs.Var(&urls, "url", "broker URL; repeat it or separate with commas for several nodes")
				fs.StringVar(&user, "user", "", "user name")
				fs.StringVar(&password, "password", "", "password, stored in the contexts file (mode 0600)")
				fs.StringVar(&passwordFile, "password-file", "", "file to read the password from at each use (stored as a path)")
				fs.BoolVar(&use, "use", false, "make it the current context")
				return func(ctx context.Context, e *env, args []string) error {
					if len(urls) == 0 {
						return usagef("a context needs --url")
					}
					if password != "" && passwordFile != "" {
						return usagef("give --password or --password-file, not both")
					}
					if err := noCredentialsIn(urls); err != nil {
						return err
					}
					if passwordFile != "" {
						// Read at each use, from wherever narad then runs.
						abs, err := filepath.Abs(passwordFile)
						if err != nil {
							return fmt.Errorf("--password-file: %w", err)
						}
						passwordFile = abs
					}
					s, err := loadContexts(e.Getenv)
					if err != nil {
						return err
					}
					s.Contexts[args[0]] = savedContext{URLs: urls, User: user, Password: password, PasswordFile: passwordFile}
					if use || s.Current == "" {
						s.Current = args[0]
					}
					return saveContexts(e.Getenv, s)
				}
			}},
		{name: "use", usage: "NAME", args: 1, local: true, summary: "make a context the current one",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					s, err := loadContexts(e.Getenv)
					if err != nil {
						return err
					}
					if _, ok := s.Contexts[args[0]]; !ok {
						return fmt.Errorf("no context %q: %w", args[0], errNotFound)
					}
					s.Current = args[0]
					return saveContexts(e.Getenv, s)
				}
			}},
		{name: "list", usage: "[--output table|json]", args: 0, local: true, summary: "list the contexts (passwords never shown)",
			setup: func(fs *flag.FlagSet) runFunc {
				out := fs.String("output", "table", "table or json")
				fs.StringVar(out, "o", "table", "short for --output")
				return func(ctx context.Context, e *env, args []string) error {
					s, err := loadContexts(e.Getenv)
					if err != nil {
						return err
					}
					names := make([]string, 0, len(s.Contexts))
					for n := range s.Contexts {
						names = append(names, n)
					}
					slices.Sort(names)
					type row struct {
						Name     string   `json:"name"`
						Current  bool     `json:"current"`
						URLs     []string `json:"urls"`
						User     string   `json:"user,omitempty"`
						Password string   `json:"password,omitempty"`
					}
					rows := make([]row, len(names))
					for i, n := range names {
						c := s.Contexts[n]
						rows[i] = row{Name: n, Current: n == s.Current, URLs: c.URLs, User: c.User}
						switch {
						case c.Password != "":
							rows[i].Password = "saved"
						case c.PasswordFile != "":
							rows[i].Password = "file " + c.PasswordFile
						}
					}
					switch *out {
					case "json":
						return writeJSON(e.Stdout, rows)
					case "table", "raw":
						tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
						fmt.Fprintln(tw, "CURRENT\tNAME\tURLS\tUSER\tPASSWORD")
						for _, r := range rows {
							mark := ""
							if r.Current {
								mark = "*"
							}
							fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, r.Name, strings.Join(r.URLs, ","), r.User, r.Password)
						}
						return tw.Flush()
					}
					return usagef("--output %q: want table or json", *out)
				}
			}},
		{name: "remove", usage: "NAME", args: 1, local: true, summary: "delete a context",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					s, err := loadContexts(e.Getenv)
					if err != nil {
						return err
					}
					if _, ok := s.Contexts[args[0]]; !ok {
						return fmt.Errorf("no context %q: %w", args[0], errNotFound)
					}
					delete(s.Contexts, args[0])
					if s.Current == args[0] {
						s.Current = ""
					}
					return saveContexts(e.Getenv, s)
				}
			}},
	}
}
