package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// devAddr is where `narad serve --dev` listens unless --http-addr says otherwise.
const devAddr = "127.0.0.1:7942"

// devArgs turns `narad serve --dev [flags]` into an ordinary serve: loopback only,
// security off, data in a new temporary directory that cleanup removes. It rewrites the
// arguments instead of adding a flag to serve's config, so a playground cannot be
// configured into a real node by a stray NARAD_DEV or --config key. Without --dev the
// arguments pass through unchanged and cleanup does nothing.
func devArgs(args []string) (out []string, cleanup func(), err error) {
	cleanup = func() {}
	if !slices.Contains(args, "--dev") && !slices.Contains(args, "-dev") {
		return args, cleanup, nil
	}
	addr := devAddr
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--dev" || a == "-dev" {
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !isFlag(a) {
			out = append(out, a)
			continue
		}
		switch name {
		case "data-dir", "admin-password", "config", "insecure":
			return nil, cleanup, fmt.Errorf("--dev sets its own data directory and turns security off: it does not take --%s", name)
		case "http-addr":
			if hasValue {
				addr = value
			} else if i+1 < len(args) {
				i++
				addr = args[i]
			}
			continue
		}
		out = append(out, a)
	}
	dir, err := os.MkdirTemp("", "narad-dev-")
	if err != nil {
		return nil, cleanup, err
	}
	// A developer's NARAD_ADMIN_PASSWORD or NARAD_CONFIG must not turn a playground
	// into something else; flags given on the command line still apply.
	// (Unsetenv fails only for a malformed name; these are constants.)
	_ = os.Unsetenv("NARAD_ADMIN_PASSWORD")
	_ = os.Unsetenv("NARAD_CONFIG")
	_ = os.Unsetenv("NARAD_INSECURE")
	_ = os.Unsetenv("NARAD_DATA_DIR")
	fmt.Fprintf(os.Stderr, "narad: dev mode: http://%s, security off, data in %s (removed at exit)\n", addr, dir)
	out = append([]string{"--http-addr", addr, "--data-dir", dir, "--admin-password="}, out...)
	return out, func() { _ = os.RemoveAll(dir) }, nil // a temp dir: nothing to do if it stays
}

func isFlag(a string) bool { return strings.HasPrefix(a, "-") && a != "-" && a != "--" }
