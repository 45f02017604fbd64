// Package apigen holds the broker's HTTP server interface and models, generated from
// openapi.yaml by oapi-codegen. Nothing in it is written by hand.
package apigen

//go:generate go tool oapi-codegen -config cfg.yaml ../../../openapi.yaml
