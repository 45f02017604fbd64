// Package console serves the web console: static files built from ../../../console
// (Preact + TypeScript, bundled by esbuild) and embedded in the binary, so a node needs
// nothing else to show it. The files hold no data and need no credentials; the page
// calls the public API with the credentials its user types in, so the API's
// authentication and grants apply to everything it shows or does.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
)

// Prefix is where the console lives.
const Prefix = "/console"

//go:embed static
var static embed.FS

// files are the built console: index.html, app.js, app.css.
var files = mustSub(static, "static")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err) // static is embedded at build time; a missing directory fails the build first
	}
	return sub
}

// contentTypes are the console's file types (net/http would guess them from the name
// too, but from the system's MIME tables, which differ between machines).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

// policy allows the page nothing but its own files and its own origin's API: no inline
// script, no other site, no framing (clickjacking of the admin actions).
const policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Handler serves the console at Prefix and everything else with api.
func Handler(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p != Prefix && (len(p) <= len(Prefix) || p[:len(Prefix)+1] != Prefix+"/") {
			api.ServeHTTP(w, r)
			return
		}
		serve(w, r, p)
	})
}

func serve(w http.ResponseWriter, r *http.Request, p string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the console's files are read with GET", http.StatusMethodNotAllowed)
		return
	}
	name := "index.html"
	if rest := p[len(Prefix):]; rest != "" && rest != "/" {
		name = path.Clean(rest[1:])
	}
	data, err := fs.ReadFile(files, name)
	ct, known := contentTypes[path.Ext(name)]
	if err != nil || !known {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", ct)
	h.Set("Content-Security-Policy", policy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache") // a new binary's console is fetched at once
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(data) // the client went away: nothing to do
}
