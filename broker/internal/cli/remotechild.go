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

// remotePassword reads the remote user's password from file, else from
// NARAD_REMOTE_PASSWORD: never from a flag, which shows in ps.
func remotePassword(e *env, file string) (string, error) {
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", usagef("reading --remote-password-file: %v", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	case e.Getenv("NARAD_REMOTE_PASSWORD") != "":
		return e.Getenv("NARAD_REMOTE_PASSWORD"), nil
	}
	return "", usagef("give the remote user's password with --remote-password-file or NARAD_REMOTE_PASSWORD")
}

// setRemotePassword gives remote child id of parent the remote user's new password.
func setRemotePassword(ctx context.Context, e *env, parent, id, file string) error {
	pass, err := remotePassword(e, file)
	if err != nil {
		return err
	}
	return e.withClient(ctx, func(c *narad.Client) error {
		if err := c.SetRemoteChildPassword(ctx, parent, id, pass); err != nil {
			return err
		}
		return printDone(e, map[string]string{"password_replaced": id, "parent": parent})
	})
}

func attachRemote(ctx context.Context, e *env, parent, child string, r remoteFlags) error {
	if r.user == "" {
		return usagef("--remote-url needs --remote-user")
	}
	spec := narad.RemoteChildSpec{URL: r.url, Username: r.user, Start: r.start}
	var err error
	if spec.Password, err = remotePassword(e, r.passwordFile); err != nil {
		return err
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

// remoteUpdateFlags are the flags of `topic remote-update`.
type remoteUpdateFlags struct {
	url, user, passwordFile, caFile string
	systemCA                        bool
}

// updateRemote changes remote child id of parent in place. Every change sends the
// remote user's password (--remote-password-file, else NARAD_REMOTE_PASSWORD): the
// broker sends the stored one only where it went before, so a new URL or CA needs it,
// and so does a new user.
func updateRemote(ctx context.Context, e *env, parent, id string, o remoteUpdateFlags) error {
	var u narad.RemoteChildUpdate
	if o.url != "" {
		u.URL = &o.url
	}
	if o.user != "" {
		u.Username = &o.user
	}
	switch {
	case o.caFile != "" && o.systemCA:
		return usagef("--remote-ca-file and --remote-system-ca say opposite things; give one")
	case o.caFile != "":
		b, err := os.ReadFile(o.caFile)
		if err != nil {
			return usagef("reading --remote-ca-file: %v", err)
		}
		pem := string(b)
		u.CAPEM = &pem
	case o.systemCA:
		none := ""
		u.CAPEM = &none
	}
	if u == (narad.RemoteChildUpdate{}) && o.passwordFile == "" {
		return usagef("say what to change: --remote-url, --remote-user, --remote-password-file, --remote-ca-file or --remote-system-ca")
	}
	pass, err := remotePassword(e, o.passwordFile)
	if err != nil {
		return err
	}
	u.Password = &pass
	return e.withClient(ctx, func(c *narad.Client) error {
		ch, err := c.UpdateRemoteChild(ctx, parent, id, u)
		if err != nil {
			return err
		}
		return printChildren(e, []narad.Child{*ch})
	})
}
