// Package testutil holds helpers shared by the broker's tests: locating the
// repository, validating HTTP responses against openapi.yaml, an HTTP client whose
// every response is validated, a harness that builds and runs the real narad binary,
// and polling helpers that wait for a condition with a deadline instead of sleeping.
package testutil
