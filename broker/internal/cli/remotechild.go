package cli

import (
	"context"
	"flag"
	"os"
	"strings"

	narad "github.com/narad-mq/narad/sdk-go"
)

// remoteFlags are the flags of `topic attach` that make the child a remote child. The
// password is read from a file or NARAD_REMOTE_PASSWORD, never from a flag: flags show
// in ps.
type remoteFlags struct {
	url, user, passwordFile, caFile, start string
}

func (r *remoteFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.url, "remote-url", "", "make CHILD a topic of the cluster at this base URL (a remote child)")
	fs.StringVar(&r.user, "remote-user", "", "the remote cluster's user the copy produces as")
	fs.StringVar(&r.passwordFile, "remote-password-file", "", "file holding that user's password (else NARAD_REMOTE_PASSWORD)")
	fs.StringVar(&r.caFile, "remote-ca-file", "", "PEM file of the CA certificates to trust for an https remote")
	fs.StringVar(&r.start, "start", "", "now (default): copy what is committed from now on; earliest: also what PARENT holds")
}

func (r remoteFlags) given() bool {
	return r.user != "" || r.passwordFile != "" || r.caFile != "" || r.start != ""
}

func attachRemote(ctx context.Context, e *env, parent, child string, r remoteFlags) error {
	if r.user == "" {
		return usagef("--remote-url needs --remote-user")
	}
	spec := narad.RemoteChildSpec{URL: r.url, Username: r.user, Start: r.start}
	switch {
	case r.passwordFile != "":
		b, err := os.ReadFile(r.passwordFile)
		if err != nil {
			return usagef("reading --remote-password-file: %v", err)
		}
		spec.Password = strings.TrimRight(string(b), "\r\n")
	case e.Getenv("NARAD_REMOTE_PASSWORD") != "":
		spec.Password = e.Getenv("NARAD_REMOTE_PASSWORD")
	default:
		return usagef("give the remote user's password with --remote-password-file or NARAD_REMOTE_PASSWORD")
	}
	if r.caFile != "" {
		b, err := os.ReadFile(r.caFile)
		if err != nil {
			return usagef("reading --remote-ca-file: %v", err)
		}
		spec.CAPEM = string(b)
	}
	return e.withClient(ctx, func(c *narad.Client) error {
		ch, err := c.AttachRemoteChild(ctx, parent, child, spec)
		if err != nil {
			return err
		}
		return printChildren(e, []narad.Child{*ch})
	})
}
