package cli

import (
	"context"
	"flag"
)

// runFunc runs a command with its positional arguments, once its flags are parsed.
type runFunc func(ctx context.Context, e *env, args []string) error

// command is one row of the command table: a group (sub set) or a leaf (setup set).
type command struct {
	name    string
	usage   string // what follows the command's path in its usage line
	summary string
	help    string // more, shown by --help
	// args is the number of positional arguments: n >= 0 exactly n; n < 0 at least -n-1.
	args int
	// local commands talk to no broker and take none of the connection flags.
	local bool
	sub   []*command
	// setup registers the command's flags on fs and returns what runs it. It is also
	// called on a throwaway FlagSet to list the flags for completion.
	setup func(fs *flag.FlagSet) runFunc
}

// commands is the table of every CLI command.
func commands() []*command {
	return []*command{
		{name: "topic", summary: "create, list, inspect, alter and delete topics; fan-out children", sub: topicCommands()},
		produceCommand(),
		consumeCommand(),
		replayCommand(),
		{name: "user", summary: "create, list, inspect and delete users; grants and passwords", sub: userCommands()},
		{name: "cluster", summary: "members, partition moves and decommissioning", sub: clusterCommands()},
		benchCommand(),
		{name: "context", summary: "named brokers and credentials, saved in a file of mode 0600", sub: contextCommands()},
		completionCommand(),
	}
}
