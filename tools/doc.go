// Package tools pins the linters that `make lint` runs (staticcheck and errcheck) as
// tool directives in this module's go.mod. The module sits outside go.work, like
// bench/peers, so the linters' dependencies never join the build list of the broker
// or the SDK. The root Makefile builds both with `go -C tools build` and runs them in
// every Go module; `go tool staticcheck` here runs the same pinned version by hand.
package tools
