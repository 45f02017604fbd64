package httpapi

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// A broker without security (the default on loopback) answers anyone who reaches its
// port, and a web page the developer visits can reach it: a form or fetch() can post
// text/plain JSON to 127.0.0.1 without a CORS preflight, and a page whose name an
// attacker re-points at 127.0.0.1 (DNS rebinding) can even read the answers. Security
// off must not mean "open to every web page", so without it the broker serves only
// requests whose Host is a loopback name, an IP address or one of --allowed-hosts, and
// refuses cross-site requests that change state. With security on the credentials decide
// who may do what, but a browser attaches cached Basic credentials to a cross-site form
// post as well (cross-site request forgery), so cross-site requests that change state are
// refused with security on too.

// hostRules decides which Host headers a broker without security serves.
type hostRules struct {
	exact    map[string]bool // lower case, no port, no trailing dot
	suffixes []string        // ".example.com": any subdomain
	any      bool            // "*": every host
}

func newHostRules(allowed []string) hostRules {
	r := hostRules{exact: make(map[string]bool)}
	for _, h := range allowed {
		h = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
		switch {
		case h == "":
		case h == "*":
			r.any = true
		case strings.HasPrefix(h, "*."):
			r.suffixes = append(r.suffixes, h[1:])
		case strings.HasPrefix(h, "."):
			r.suffixes = append(r.suffixes, h)
		default:
			r.exact[h] = true
		}
	}
	return r
}

// allows reports whether a request with this Host header is served. An IP address
// cannot be re-pointed by DNS, and "localhost" and its subdomains resolve to loopback
// in browsers whatever DNS says, so those are always served.
func (r hostRules) allows(hostport string) bool {
	if hostport == "" || r.any {
		return true // HTTP/1.0 without Host: no browser sends that
	}
	host := hostOnly(hostport)
	if net.ParseIP(host) != nil {
		return true
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || r.exact[host] {
		return true
	}
	for _, s := range r.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// hostOnly strips the port (and an IPv6 literal's brackets) from a Host header.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
}

// changesState reports whether an operation changes the broker's state. The two
// consumes are GETs but take leases.
func changesState(r *http.Request, oi *opInfo) bool {
	if oi == nil {
		return false
	}
	switch oi.id {
	case "consume", "consumeBatch":
		return true
	}
	return r.Method != http.MethodGet && r.Method != http.MethodHead
}

// checkBrowser applies the rules of a broker without security to one request.
func (s *server) checkBrowser(r *http.Request, oi *opInfo) error {
	if oi != nil && (oi.id == "healthz" || oi.id == "readyz") {
		return nil // probes come with whatever Host their platform sets, and change nothing
	}
	if !s.hosts.allows(r.Host) {
		return forbidden("the Host " + clip(r.Host, maxEcho) + " is not a name of this broker: with security off it serves only loopback names, IP addresses and the names in --allowed-hosts, so that a web page cannot reach it by DNS rebinding; add the name to --allowed-hosts (NARAD_ALLOWED_HOSTS), or turn security on (NARAD_ADMIN_PASSWORD)")
	}
	return checkCrossSite(r, oi)
}

// checkCrossSite refuses a request that changes state and comes from a page of another
// site, security on or off.
func checkCrossSite(r *http.Request, oi *opInfo) error {
	if !changesState(r, oi) {
		return nil
	}
	// Only a page of the broker's own origin, or the user typing the address ("none"),
	// may change state. "same-site" is another origin of the same site: another port
	// of the same host (any page a developer serves on localhost), or a sibling
	// subdomain; an <img> or no-cors fetch of consume from it carries no Origin.
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site":
		return crossSite("a page of another site")
	case "same-site":
		return crossSite("a page of another origin of this site (another port or subdomain)")
	}
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r) {
		return crossSite("the page " + clip(origin, maxEcho))
	}
	return nil
}

func crossSite(who string) error {
	return forbidden("this request comes from " + who + ", and the broker refuses cross-site requests that change state, so that no web page can write to it with a visitor's browser; call the broker from a program (its SDKs send no Origin), or serve the page from the broker's own origin")
}

// sameOrigin reports whether an Origin header names the host and port the request was
// sent to. "null" (a sandboxed frame, a file:// page) never matches.
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme && strings.EqualFold(withPort(u.Host, u.Scheme), withPort(r.Host, scheme))
}

// withPort adds the scheme's default port to a host without one.
func withPort(hostport, scheme string) string {
	if _, _, err := net.SplitHostPort(hostport); err == nil {
		return hostport
	}
	port := "80"
	if scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(hostOnly(hostport), port)
}
