// Command narad is the Narad broker: one binary, `narad serve` runs a node, and the
// other commands (internal/cli) are its command line client.
//
// The command is three files: main.go (the commands), config.go (flags, NARAD_*
// variables and the --config file, into one validated config) and serve.go (the one
// place the node is wired together and taken apart).
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/narad-mq/narad/broker/internal/cli"
	"github.com/narad-mq/narad/broker/internal/meta"
)

// version, commit and date are set by a release build (-ldflags "-X main.version=...",
// see tools/release).
var (
	version = "dev"
	commit  = ""
	date    = ""
)

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		args, cleanup, err := devArgs(os.Args[2:])
		if err == nil {
			err = serve(args)
			cleanup()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "narad:", err)
			os.Exit(1)
		}
	case "downgrade-format":
		runDowngrade()
	case "version", "--version":
		fmt.Println(versionLine())
	case "help", "-h", "--help":
		usage(os.Stdout)
	default:
		if cli.Has(os.Args[1]) {
			os.Exit(cli.Main(os.Args[1:]))
		}
		fmt.Fprintf(os.Stderr, "narad: unknown command %q\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
}

// versionLine is what `narad version` prints: the version, and the commit and build
// date of a release build; on a second line the cluster versions it speaks.
func versionLine() string {
	s := "narad " + version
	if commit != "" {
		s += " (commit " + commit
		if date != "" {
			s += ", built " + date
		}
		s += ")"
	}
	// The cluster versions it speaks: what a rolling upgrade waits for
	// (docs/operating/upgrades.md).
	return s + fmt.Sprintf("\ncluster versions %d to %d", meta.VersionMin, meta.VersionMax)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: narad <command> [flags]

commands:
  serve       run a broker node (narad serve --help lists its flags; --dev: a playground)
  version     print the version
  downgrade-format --to N   take a stopped node's data directory back to format N (a rollback)
`)
	cli.Usage(w)
	fmt.Fprint(w, "\nnarad <command> --help shows a command's flags; docs/guides/cli.md has the exit codes.\n")
}
