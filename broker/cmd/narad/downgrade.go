package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/narad-mq/narad/broker/internal/storage/format"
)

// downgradeFormat is `narad downgrade-format`: it takes a stopped node's data
// directory back to an older format, so that the binary of an earlier release starts
// on it (docs/operating/upgrades.md, "Rolling back"). It returns the exit code: 0 done
// (or nothing to do), 1 refused or failed, 2 bad usage.
func downgradeFormat(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("downgrade-format", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := "./data"
	if v := getenv("NARAD_DATA_DIR"); v != "" {
		dataDir = v
	}
	fs.StringVar(&dataDir, "data-dir", dataDir, "the stopped node's data directory (default NARAD_DATA_DIR, else ./data, as for narad serve)")
	to := fs.Int("to", 0, "the format to take the directory back to: the one the older binary knows (it names it when it refuses to start)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: narad downgrade-format --to N [--data-dir DIR]

Takes a stopped node's data directory back to format N, so that an older binary
that knows only format N starts on it: the rollback of an upgrade in place, keeping
everything the node stored and its place in the cluster. Stop the node first; a
directory in use is refused. This binary knows formats 1 to %d; format 1 is reached
only by restoring a backup.

flags:
`, format.Current)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "narad downgrade-format: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if *to == 0 {
		fmt.Fprintln(stderr, "narad downgrade-format: --to is required: the format the older binary knows (it names it when it refuses to start)")
		return 2
	}
	if *to < 1 {
		fmt.Fprintf(stderr, "narad downgrade-format: --to %d: formats start at 1; give the format the older binary knows (it names it when it refuses to start)\n", *to)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	me := "narad " + version
	res, err := format.Downgrade(dataDir, *to, format.Options{WrittenBy: me, Logger: log})
	if err != nil {
		fmt.Fprintln(stderr, "narad downgrade-format:", err)
		return 1
	}
	if res.Found <= *to {
		if res.Folded {
			fmt.Fprintf(stdout, "%s is at format %d already; folded the write-ahead directory found beside it into the partitions' files\n", dataDir, res.Found)
			return 0
		}
		fmt.Fprintf(stdout, "%s is at format %d already: nothing to do\n", dataDir, res.Found)
		return 0
	}
	fmt.Fprintf(stdout, "%s is at format %d now (was %d); start it with the binary that knows format %d\n", dataDir, *to, res.Found, *to)
	return 0
}

func runDowngrade() {
	os.Exit(downgradeFormat(os.Args[2:], os.Getenv, os.Stdout, os.Stderr))
}
