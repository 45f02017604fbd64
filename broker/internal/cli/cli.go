// Package cli is the `narad` command line client: topic, produce, consume, replay,
// user, cluster, bench, context and completion. It speaks only the public HTTP API,
// through the Go SDK (github.com/narad-mq/narad/sdk-go), so it can do nothing an
// application cannot, and a change of the API reaches it through the SDK.
//
// Every command is a row of one table (commands.go); usage text and the shell
// completion scripts are generated from it, so they cannot drift from what parses.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
)

// Exit codes, for scripts. They are documented in docs/guides/cli.md; keep the two in step.
const (
	ExitOK           = 0
	ExitFailed       = 1 // the command failed for another reason (conflict, bad request, ...)
	ExitUsage        = 2 // the command line is wrong
	ExitNotFound     = 3 // a topic, user, partition, child or node does not exist
	ExitUnauthorized = 4 // the credentials are missing or wrong, or do not allow it
	ExitUnavailable  = 5 // no node answered, or the node could not serve now
)

// IO is where a command reads and writes, and the environment it sees; Main uses the
// process's, tests their own.
type IO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// StdoutIsTerminal says whether Stdout is a terminal: raw binary payloads are
	// never written to one.
	StdoutIsTerminal bool
}

// Has reports whether name is a command of this package (not `serve` or `version`).
func Has(name string) bool {
	for _, c := range commands() {
		if c.name == name {
			return true
		}
	}
	return false
}

// Main runs the command in args (without the program name) with the process's stdio
// and environment, stopping cleanly on SIGINT and SIGTERM, and returns the exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A write to a closed pipe (narad consume | head -1) fails with EPIPE instead of
	// killing the process: a consume then hands back what it did not write, where
	// dying would leave its batch leased for the visibility timeout.
	signal.Ignore(syscall.SIGPIPE)
	return Run(ctx, args, IO{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
		StdoutIsTerminal: isTerminal(os.Stdout),
	})
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Run runs one command and returns its exit code. Errors are written to Stderr.
func Run(ctx context.Context, args []string, io IO) int {
	if io.Getenv == nil {
		io.Getenv = func(string) string { return "" }
	}
	leaf, path, rest, err := find(args)
	if err != nil {
		fmt.Fprintln(io.Stderr, "narad:", err)
		return ExitUsage
	}
	fs := flag.NewFlagSet("narad "+path, flag.ContinueOnError)
	fs.SetOutput(io.Stderr)
	g := &globals{}
	if !leaf.local {
		g.register(fs)
	}
	run := leaf.setup(fs)
	fs.Usage = func() { printLeafUsage(io.Stderr, path, leaf, fs) }
	pos, err := parseInterspersed(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		return ExitUsage // flag has printed the error and the usage
	}
	if err := refuseNegative(fs); err != nil {
		fmt.Fprintf(io.Stderr, "narad %s: %v\n", path, err)
		return ExitUsage
	}
	if leaf.args >= 0 && len(pos) != leaf.args || leaf.args < 0 && len(pos) < -leaf.args-1 {
		fmt.Fprintf(io.Stderr, "narad %s: wrong arguments %q\n", path, pos)
		fs.Usage()
		return ExitUsage
	}
	e := &env{IO: io, g: g, path: path}
	defer e.close()
	err = run(ctx, e, pos)
	if err == nil {
		return ExitOK
	}
	if ctx.Err() != nil {
		// Stopped by SIGINT or SIGTERM before it finished: a produce that had more to
		// send, a drain or a replay short of its end. A --follow or a --peek, which
		// only a signal ends, returns nil instead; any other command did not do all it
		// was asked, and a script must not read its exit as success. The SDK may
		// report the cut call as canceled or as a timeout.
		fmt.Fprintf(io.Stderr, "narad %s: stopped by a signal before it finished (what it printed is done): %s\n", path, errText(err))
		if narad.Uncertain(err) {
			// A write whose request was sent and whose answer had not come: done or
			// not, nobody knows, and a user who reads only the line above would send
			// it again.
			fmt.Fprintf(io.Stderr, "narad %s: the request under way when the signal came may be stored: its answer did not come. Read the topic before sending it again\n", path)
		}
		return ExitFailed
	}
	fmt.Fprintf(io.Stderr, "narad %s: %s\n", path, errText(err))
	return exitCode(err)
}

// errText is err as a command prints it after its own "narad <command>: ": without
// the SDK's "narad: " in front, which said the same twice ("narad produce: narad:
// produce orders at …").
func errText(err error) string {
	return strings.TrimPrefix(err.Error(), "narad: ")
}

// refuseNegative refuses a negative number or duration given to any flag: no flag of
// the CLI takes one, and several read a negative as "not given" (--partition -2 would
// pick a partition by key, --partitions -3 and --visibility -5s would take the
// broker's defaults, --max -1 would consume nothing and exit 0).
func refuseNegative(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok || err != nil {
			return
		}
		neg := false
		switch v := g.Get().(type) {
		case int:
			neg = v < 0
		case int64:
			neg = v < 0
		case float64:
			neg = v < 0
		case time.Duration:
			neg = v < 0
		}
		if neg {
			err = fmt.Errorf("--%s %s: cannot be negative (narad %s --help lists what it takes)", f.Name, f.Value, fs.Name()[len("narad "):])
		}
	})
	return err
}

// usageError is a command line that parsed but cannot work.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// errNotFound is a local thing (a context) that does not exist: exit code 3, like
// the broker's 404.
var errNotFound = errors.New("not found")

// exitCode maps an error to the exit code scripts see.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case errors.As(err, &ue):
		return ExitUsage
	case errors.Is(err, narad.ErrNotFound), errors.Is(err, errNotFound):
		return ExitNotFound
	case errors.Is(err, narad.ErrUnauthenticated), errors.Is(err, narad.ErrForbidden):
		return ExitUnauthorized
	case errors.Is(err, narad.ErrUnavailable), errors.Is(err, narad.ErrTimeout), errors.Is(err, narad.ErrThrottled):
		return ExitUnavailable
	}
	return ExitFailed
}

// find walks args down the command table to a leaf and returns it, its path ("topic
// create") and the arguments after it.
func find(args []string) (*command, string, []string, error) {
	level := commands()
	var path []string
	for {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			return nil, "", nil, fmt.Errorf("%s needs a command: %s", strings.Join(append([]string{"narad"}, path...), " "), names(level))
		}
		var c *command
		for _, x := range level {
			if x.name == args[0] {
				c = x
			}
		}
		if c == nil {
			return nil, "", nil, fmt.Errorf("unknown command %q; try one of: %s", strings.Join(append(path, args[0]), " "), names(level))
		}
		path, args = append(path, c.name), args[1:]
		if c.sub == nil {
			return c, strings.Join(path, " "), args, nil
		}
		level = c.sub
	}
}

func names(cs []*command) string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name
	}
	return strings.Join(out, ", ")
}

// parseInterspersed parses flags anywhere among the positional arguments (`narad topic
// create orders --partitions 3`), which the flag package alone stops at; after "--"
// everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos, tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return append(pos, tail...), nil
}

// Usage writes the list of the CLI's commands, for narad's own usage text.
func Usage(w io.Writer) {
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
}

func printLeafUsage(w io.Writer, path string, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: narad %s %s\n\n%s\n", path, c.usage, c.summary)
	if c.help != "" {
		fmt.Fprintf(w, "\n%s\n", c.help)
	}
	fmt.Fprintln(w, "\nflags:")
	fs.PrintDefaults()
}
