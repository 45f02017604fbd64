package cli

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	narad "github.com/narad-mq/narad/sdk-go"
)

// grantList is the repeatable --grant ACTION:TOPIC[,TOPIC...] flag.
type grantList []narad.Grant

func (g *grantList) String() string {
	parts := make([]string, len(*g))
	for i, x := range *g {
		parts[i] = x.Action + ":" + strings.Join(x.Topics, ",")
	}
	return strings.Join(parts, " ")
}

func (g *grantList) Set(v string) error {
	action, topics, ok := strings.Cut(v, ":")
	if !ok || action == "" || topics == "" {
		return fmt.Errorf("want ACTION:TOPIC[,TOPIC...], e.g. consume:orders,invoices.*")
	}
	switch action {
	case "produce", "consume", "create", "admin":
	default:
		return fmt.Errorf("action %q: want produce, consume, create or admin", action)
	}
	*g = append(*g, narad.Grant{Action: action, Topics: strings.Split(topics, ",")})
	return nil
}

type userJSON struct {
	Name   string      `json:"username"`
	Grants []grantJSON `json:"grants"`
}

type grantJSON struct {
	Action string   `json:"action"`
	Topics []string `json:"topics"`
}

func printUsers(e *env, us []narad.User, single bool) error {
	f, err := e.format()
	if err != nil {
		return err
	}
	switch f {
	case "json":
		out := make([]userJSON, len(us))
		for i, u := range us {
			out[i] = userJSON{Name: u.Name, Grants: []grantJSON{}}
			for _, g := range u.Grants {
				out[i].Grants = append(out[i].Grants, grantJSON(g))
			}
		}
		if single {
			return writeJSON(e.Stdout, out[0])
		}
		return writeJSON(e.Stdout, out)
	case "raw":
		for _, u := range us {
			fmt.Fprintln(e.Stdout, u.Name)
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "USER\tGRANTS")
	for _, u := range us {
		g := grantList(u.Grants)
		fmt.Fprintf(tw, "%s\t%s\n", u.Name, g.String())
	}
	return tw.Flush()
}

// newPassword reads a password given to a command (not the caller's own): from its
// flag, or the first line of stdin with the -stdin flag, so it need not show in ps.
func newPassword(e *env, flagValue string, fromStdin bool, name string) (string, error) {
	switch {
	case flagValue != "" && fromStdin:
		return "", usagef("give --%s or --%s-stdin, not both", name, name)
	case flagValue != "":
		return flagValue, nil
	case fromStdin:
		sc := bufio.NewScanner(e.Stdin)
		if !sc.Scan() {
			return "", usagef("--%s-stdin: stdin is empty", name)
		}
		return strings.TrimRight(sc.Text(), "\r"), nil
	}
	return "", usagef("give --%s or --%s-stdin", name, name)
}

func userCommands() []*command {
	return []*command{
		{name: "create", usage: "NAME (--new-password P | --new-password-stdin) [--grant ACTION:TOPICS]...", args: 1,
			summary: "create a user (the first user of a broker turns security on)",
			help:    "Actions: produce, consume (also ack and replay), create, admin; topics are exact names or prefix wildcards (orders.*).",
			setup: func(fs *flag.FlagSet) runFunc {
				var grants grantList
				pw := fs.String("new-password", "", "the new user's password (prefer --new-password-stdin: flags show in ps)")
				pwStdin := fs.Bool("new-password-stdin", false, "read the new user's password from the first line of stdin")
				fs.Var(&grants, "grant", "ACTION:TOPIC[,TOPIC...]; repeat for several")
				return func(ctx context.Context, e *env, args []string) error {
					p, err := newPassword(e, *pw, *pwStdin, "new-password")
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						u, err := c.CreateUser(ctx, args[0], p, grants)
						if err != nil {
							return err
						}
						return printUsers(e, []narad.User{*u}, true)
					})
				}
			}},
		{name: "list", usage: "", args: 0, summary: "list the users and their grants",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						us, err := c.Users(ctx)
						if err != nil {
							return err
						}
						return printUsers(e, us, false)
					})
				}
			}},
		{name: "get", usage: "NAME", args: 1, summary: "a user's grants",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						u, err := c.User(ctx, args[0])
						if err != nil {
							return err
						}
						return printUsers(e, []narad.User{*u}, true)
					})
				}
			}},
		{name: "grant", usage: "NAME --grant ACTION:TOPICS [--grant ...]", args: 1,
			summary: "replace a user's grants with the ones given (none: --none)",
			setup: func(fs *flag.FlagSet) runFunc {
				var grants grantList
				fs.Var(&grants, "grant", "ACTION:TOPIC[,TOPIC...]; repeat for several")
				none := fs.Bool("none", false, "take every grant away")
				return func(ctx context.Context, e *env, args []string) error {
					if len(grants) == 0 && !*none {
						return usagef("give the grants (--grant ACTION:TOPICS, repeated), or --none to take them all away")
					}
					if len(grants) > 0 && *none {
						return usagef("give --grant or --none, not both")
					}
					gs := []narad.Grant(grants)
					if gs == nil {
						gs = []narad.Grant{}
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						u, err := c.ReplaceGrants(ctx, args[0], gs)
						if err != nil {
							return err
						}
						return printUsers(e, []narad.User{*u}, true)
					})
				}
			}},
		{name: "password", usage: "NAME [--current P] (--new-password P | --new-password-stdin)", args: 1,
			summary: "change a password (yours with --current, anyone's as an admin)",
			setup: func(fs *flag.FlagSet) runFunc {
				current := fs.String("current", "", "the user's current password (needed to change your own)")
				pw := fs.String("new-password", "", "the new password (prefer --new-password-stdin)")
				pwStdin := fs.Bool("new-password-stdin", false, "read the new password from the first line of stdin")
				return func(ctx context.Context, e *env, args []string) error {
					p, err := newPassword(e, *pw, *pwStdin, "new-password")
					if err != nil {
						return err
					}
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.ChangePassword(ctx, args[0], *current, p); err != nil {
							return err
						}
						return printDone(e, map[string]string{"password_changed": args[0]})
					})
				}
			}},
		{name: "delete", usage: "NAME", args: 1, summary: "delete a user",
			setup: func(fs *flag.FlagSet) runFunc {
				return func(ctx context.Context, e *env, args []string) error {
					return e.withClient(ctx, func(c *narad.Client) error {
						if err := c.DeleteUser(ctx, args[0]); err != nil {
							return err
						}
						return printDone(e, map[string]string{"deleted": args[0]})
					})
				}
			}},
	}
}
