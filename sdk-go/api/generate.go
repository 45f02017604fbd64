// Package api is the low-level Narad HTTP client, generated from openapi.yaml by
// oapi-codegen. Most programs want the package narad one level up instead.
package api

//go:generate go tool oapi-codegen -config cfg.yaml ../../openapi.yaml
