package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// remoteRequestTimeout bounds one request to a remote cluster: a remote that accepts
// the connection and then says nothing is a failure to retry, never a hang.
const remoteRequestTimeout = 30 * time.Second

// remoteClient speaks to another cluster's public HTTP API as one user, for one topic.
type remoteClient struct {
	base, topic string
	user, pass  string
	hc          *http.Client
}

// RemoteAnswerError is a remote cluster's answer other than the one asked for: its
// status and, when it sent one, its error code and message (the remote's words; they
// never hold this cluster's credentials).
type RemoteAnswerError struct {
	Status int
	Code   string
	Msg    string
	// PartlyStored is set on a produce-batch answer saying part of the batch was
	// stored: Failed are the remote partitions whose messages were not (or, with code
	// timeout, may not be); the others' were.
	PartlyStored bool
	Failed       []int32
}

func (e *RemoteAnswerError) Error() string {
	s := fmt.Sprintf("the remote answered %d", e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// checkRemoteURL refuses a remote URL a copy cannot use, saying why.
func checkRemoteURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.url %q is not a URL: %v", truncate(raw, 64), err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.url must start with http:// or https://, got %q", truncate(raw, 64))
	case u.Host == "":
		return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.url %q names no host", truncate(raw, 64))
	case u.User != nil:
		return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.url must not hold credentials; give them as remote.username and remote.password")
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.url is the remote cluster's base URL, scheme://host[:port], without a path or query")
	}
	if a, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil && forbiddenRemote(a) {
		return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.url names %s, a link-local address (where clouds serve instance metadata and credentials); a remote cluster is never there", a)
	}
	u.Path = ""
	return u, nil
}

// errForbiddenRemote refuses a connection to a link-local address.
var errForbiddenRemote = errors.New("a remote child never connects to a link-local address (where clouds serve instance metadata and credentials)")

// awsIMDSv6 is the IPv6 address of AWS's instance metadata service (not link-local).
var awsIMDSv6 = netip.MustParseAddr("fd00:ec2::254")

// forbiddenRemote reports whether a is an address no remote cluster is at, and where a
// request from a node could fetch the node's cloud credentials: link-local (IPv4
// 169.254.0.0/16, IPv6 fe80::/10, mapped or not) and AWS's IPv6 metadata address.
// Loopback and private addresses stay allowed: clusters live there (see
// docs/operating/security.md for restricting a node's outgoing traffic further).
func forbiddenRemote(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLinkLocalUnicast() || a == awsIMDSv6
}

// checkDialAddr refuses, at each connection, an address forbiddenRemote refuses: checked
// on the address actually dialled, so a name that resolves there later (DNS rebinding)
// is refused too.
func checkDialAddr(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot read the address %q", errForbiddenRemote, address)
	}
	if forbiddenRemote(ap.Addr()) {
		return fmt.Errorf("%w: %s", errForbiddenRemote, ap.Addr())
	}
	return nil
}

func newRemoteClient(rawURL, topic, user, pass, caPEM string) (*remoteClient, error) {
	u, err := checkRemoteURL(rawURL)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // a copy goes where its URL says
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, Control: checkDialAddr}).DialContext
	tr.MaxIdleConnsPerHost = 64
	tr.ResponseHeaderTimeout = remoteRequestTimeout
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if caPEM != "" {
		if u.Scheme != "https" {
			return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.ca_pem is for an https URL; %s is http", u.String())
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			return nil, invalid(apigen.ErrorCodeInvalidParameter, "remote.ca_pem holds no PEM certificate; give the remote's CA certificate(s) in PEM")
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return &remoteClient{
		base: strings.TrimSuffix(u.String(), "/"), topic: topic, user: user, pass: pass,
		hc: &http.Client{Transport: tr, Timeout: remoteRequestTimeout, CheckRedirect: noRedirect},
	}, nil
}

// noRedirect makes a redirect the remote's answer, not a request elsewhere: a copy (and
// its credentials: Go's client sends them on to another port of the same host) goes
// only where its URL says, the URL the attach checked. A 307 or 308 followed would also
// count a batch as copied that the remote at that URL never stored.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func (c *remoteClient) close() { c.hc.CloseIdleConnections() }

// do sends one request and decodes a 2xx answer into out (when not nil); any other
// answer is a *RemoteAnswerError.
func (c *remoteClient) do(ctx context.Context, method, path string, body []byte, want int, out any) error {
	ctx, cancel := context.WithTimeout(ctx, remoteRequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(c.user, c.pass)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below, or abandoned on error
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		ae := &RemoteAnswerError{Status: resp.StatusCode}
		var eb apigen.Error
		if json.Unmarshal(b, &eb) == nil {
			ae.Code, ae.Msg = string(eb.Error.Code), truncate(eb.Error.Message, 300)
			if ps := eb.Error.PartlyStored; ps != nil && len(ps.FailedPartitions) > 0 {
				ae.PartlyStored, ae.Failed = true, ps.FailedPartitions
			}
		}
		return ae
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("the remote's answer is unreadable: %w", err)
		}
	}
	return nil
}

func (c *remoteClient) topicPath(suffix string) string {
	return "/v1/topics/" + url.PathEscape(c.topic) + suffix
}

// clusterID asks the remote for its cluster id ("" when it does not tell).
func (c *remoteClient) clusterID(ctx context.Context) (string, error) {
	var cl apigen.Cluster
	if err := c.do(ctx, http.MethodGet, "/v1/cluster", nil, http.StatusOK, &cl); err != nil {
		return "", err
	}
	if cl.ClusterId == nil {
		return "", nil
	}
	return *cl.ClusterId, nil
}

// topicInfo reads the remote topic's incarnation and partition count.
func (c *remoteClient) topicInfo(ctx context.Context) (string, int32, error) {
	var t apigen.TopicDetail
	if err := c.do(ctx, http.MethodGet, c.topicPath(""), nil, http.StatusOK, &t); err != nil {
		return "", 0, err
	}
	return t.Incarnation, t.Partitions, nil
}

// produce sends one batch; nil only once the remote answered 202 (every message durable
// there).
func (c *remoteClient) produce(ctx context.Context, req *apigen.ProduceBatchRequest) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return c.produceBody(ctx, b)
}

// produceBody sends a produce-batch body made by remoteCopier.batch.
func (c *remoteClient) produceBody(ctx context.Context, body []byte) error {
	return c.do(ctx, http.MethodPost, c.topicPath("/produce-batch"), body, http.StatusAccepted, nil)
}

// remoteFailure sorts a failed request to the remote into a short class (the metric's
// label) and a reason that says what the operator can do.
func remoteFailure(err error, rc remoteTarget) (class, reason string) {
	var ae *RemoteAnswerError
	if !errors.As(err, &ae) {
		return "unreachable", "the remote cluster at " + rc.url + " cannot be reached or did not answer in time; the copy is retried with backoff (check the network and the remote's health)"
	}
	switch {
	case ae.Status == http.StatusUnauthorized:
		return "unauthenticated", "the remote refused the credentials of user " + rc.user + " (401); give this child the user's new password with PUT " + rc.credentials + " (the copy goes on from its cursor), or restore the old password on the remote"
	case ae.Status == http.StatusForbidden:
		return "forbidden", "user " + rc.user + " may not produce to " + rc.topic + " on the remote (403); grant it produce there"
	case ae.Code == string(apigen.ErrorCodeIncarnationMismatch):
		return "remote_recreated", "the remote topic " + rc.topic + " was deleted and created again since the attach; nothing is copied into the new topic: detach this child and attach it again to copy into the new one"
	case ae.Status == http.StatusNotFound:
		return "remote_topic_missing", "the remote topic " + rc.topic + " does not exist (any more); create it again and detach and attach this child, or detach it"
	case ae.Status == http.StatusRequestEntityTooLarge:
		return "too_large", "the remote refuses a message as too large (413); raise its limits or detach this child"
	case ae.Status >= 300 && ae.Status < 400:
		return "refused", fmt.Sprintf("the remote answers with a redirect (%d), which a copy does not follow; detach this child and attach it again with the URL the remote redirects to", ae.Status)
	case ae.Status >= 500 || ae.Status == http.StatusTooManyRequests:
		return "remote_unavailable", "the remote cluster answers " + fmt.Sprint(ae.Status) + "; the copy is retried with backoff"
	}
	return "refused", fmt.Sprintf("the remote refuses the copy (%d %s); fix what its message says (a schema, a limit), or detach this child", ae.Status, ae.Code)
}

// attachRefusal says why the remote refused an attach's checks, and what to do.
func attachRefusal(err error, rc remoteTarget) string {
	var ae *RemoteAnswerError
	if !errors.As(err, &ae) {
		return fmt.Sprintf("the remote cluster at %s cannot be reached (%v); check the URL (and ca_pem for https) and that it is up, then attach again", rc.url, err)
	}
	switch {
	case ae.Status == http.StatusUnauthorized:
		return "the remote refused the credentials of user " + rc.user + " (401); give the right remote.username and remote.password"
	case ae.Status == http.StatusForbidden:
		return "user " + rc.user + " may not produce to " + rc.topic + " on the remote (403); grant it produce on " + rc.topic + " there, then attach again"
	case ae.Status == http.StatusNotFound && ae.Code == string(apigen.ErrorCodeTopicNotFound):
		return "topic " + rc.topic + " does not exist on the remote cluster; create it there first (with the partitions you want), then attach again"
	case ae.Status >= 300 && ae.Status < 400:
		return fmt.Sprintf("the remote answers with a redirect (%d), which a copy does not follow; attach with the URL it redirects to (https, perhaps)", ae.Status)
	}
	return ae.Error()
}

// passwordRefusal says why the remote refused a remote child's new password, and what
// to do.
func passwordRefusal(err error, rc remoteTarget) string {
	var ae *RemoteAnswerError
	switch {
	case !errors.As(err, &ae):
		return fmt.Sprintf("the remote cluster at %s cannot be reached to check the new password (%v); try again once it answers", rc.url, err)
	case ae.Status == http.StatusUnauthorized:
		return "the remote refused user " + rc.user + "'s new password (401); give the password the remote now has"
	case ae.Status == http.StatusForbidden:
		return "the remote took the password, but user " + rc.user + " may not produce to " + rc.topic + " there (403); grant it produce there, then give the password again"
	case ae.Code == string(apigen.ErrorCodeIncarnationMismatch), ae.Status == http.StatusNotFound:
		return "the remote topic " + rc.topic + " is gone or was created again since the attach (" + ae.Error() + "); detach this child and attach it again"
	}
	return ae.Error()
}

// remoteTarget is what a failure's reason names; credentials is the route that gives a
// running child a new password.
type remoteTarget struct{ url, topic, user, credentials string }
