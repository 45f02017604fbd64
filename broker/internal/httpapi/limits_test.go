package httpapi

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/narad-mq/narad/broker/internal/auth"
	"github.com/narad-mq/narad/broker/internal/broker"
	"github.com/narad-mq/narad/broker/internal/meta"
	"github.com/narad-mq/narad/broker/internal/testutil"
)

// specOnly marks a bound that only the request validator enforces (there is no Go check
// to share a constant with), said once here rather than as a bare number below.
func specOnly(n float64, why string) float64 { return n }

// goBounds are the bounds openapi.yaml must state, by parameter or property name and
// bound, in terms of the Go constants that enforce them.
var goBounds = map[string]map[string]float64{
	"topic":        {"minLength": 1, "maxLength": broker.MaxTopicNameLen},
	"name":         {"minLength": 1, "maxLength": broker.MaxTopicNameLen},
	"parent":       {"minLength": 1, "maxLength": broker.MaxTopicNameLen},
	"child":        {"minLength": 1, "maxLength": broker.MaxTopicNameLen},
	"topics[]":     {"minLength": 1, "maxLength": broker.MaxTopicNameLen + float64(len(".*"))}, // a grant's name or prefix wildcard
	"key":          {"maxLength": broker.MaxKeyBytes},
	"partition":    {"minimum": 0},
	"offset":       {"minimum": 0},
	"partitions":   {"minimum": 1, "maximum": broker.MaxPartitions},
	"retention_ms": {"minimum": broker.MinRetentionMs, "maximum": broker.MaxRetentionMs},
	"visibility_timeout_ms": {
		"minimum": float64(broker.MinVisibility / time.Millisecond),
		"maximum": float64(broker.MaxVisibility / time.Millisecond),
	},
	"max_in_flight_per_partition":   {"minimum": 1, "maximum": broker.MaxCapPerPartition},
	"max_acked_ahead_per_partition": {"minimum": 1, "maximum": broker.MaxCapPerPartition},
	"replication_factor":            {"minimum": 1, "maximum": broker.MaxReplicationFactor},
	"fanout_delay_ms":               {"minimum": 0, "maximum": broker.MaxFanoutDelayMs},
	"max":                           {"minimum": 1, "maximum": broker.MaxBatch},
	"messages":                      {"minItems": 1, "maxItems": broker.MaxBatch},
	"acks":                          {"minItems": 1, "maxItems": broker.MaxBatch},
	"receipt_handle":                {"minLength": 1, "maxLength": maxHandleChars},
	"extend":                        {"maxLength": maxExtendChars},
	"wait":                          {"maxLength": specOnly(32, "parseWait reads any length; the validator bounds the text")},
	"from_time":                     {"maxLength": specOnly(64, "parseTime reads any length; the validator bounds the text")},
	"from": {
		"minimum":   0, // the read route's offset
		"minLength": 1, "maxLength": specOnly(128, "a node id of the cluster routes"),
	},
	"to":               {"minLength": 1, "maxLength": specOnly(128, "a node id of the cluster routes")},
	"id":               {"minLength": 1, "maxLength": specOnly(128, "a node id of the cluster routes, or a move's id")},
	"node":             {"minLength": 1, "maxLength": specOnly(128, "a node id of the cluster routes")},
	"address":          {"minLength": 1, "maxLength": specOnly(255, "a node address of the cluster routes (a DNS name's limit)")},
	"username":         {"minLength": 1, "maxLength": auth.MaxUsernameLen},
	"password":         {"minLength": auth.MinPasswordBytes, "maxLength": auth.MaxPasswordBytes},
	"new_password":     {"minLength": auth.MinPasswordBytes, "maxLength": auth.MaxPasswordBytes},
	"current_password": {"maxLength": auth.MaxPasswordBytes},
	// Remote children and the copies they send.
	"url":         {"minLength": 1, "maxLength": broker.MaxRemoteURLLen},
	"ca_pem":      {"maxLength": broker.MaxCAPEMBytes},
	"timestamp":   {"minimum": 1},
	"incarnation": {"maxLength": maxIncarnationChars},
	"cluster_id":  {"minLength": 1, "maxLength": broker.MaxClusterIDLen},
	// Cluster versions (answers only): none is below the first.
	"version":     {"minimum": meta.VersionMin},
	"min_version": {"minimum": meta.VersionMin},
	"max_version": {"minimum": meta.VersionMin},
	// A move's progress (answers only): the share of the log the new replica holds.
	"progress": {"minimum": 0, "maximum": 1},
}

// TestSpecBoundsEqualGoConstants holds every bound openapi.yaml states (minLength,
// maxLength, minimum, maximum, minItems, maxItems of each parameter and property) equal
// to the Go constant that enforces it, so the spec, the validator built from it and the
// handlers never disagree about a limit. A bound without an entry in goBounds fails too.
func TestSpecBoundsEqualGoConstants(t *testing.T) {
	t.Parallel()
	specPath, err := testutil.SpecPath()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	var found []string // "where name bound=value", for the failure message
	seen := map[string]map[string]bool{}
	check := func(where, name string, s *openapi3.Schema) {
		if s == nil {
			return
		}
		bounds := map[string]*float64{}
		f := func(v uint64) *float64 { x := float64(v); return &x }
		if s.MinLength != 0 {
			bounds["minLength"] = f(s.MinLength)
		}
		if s.MaxLength != nil {
			bounds["maxLength"] = f(*s.MaxLength)
		}
		if s.MinItems != 0 {
			bounds["minItems"] = f(s.MinItems)
		}
		if s.MaxItems != nil {
			bounds["maxItems"] = f(*s.MaxItems)
		}
		bounds["minimum"], bounds["maximum"] = s.Min, s.Max
		for kind, v := range bounds {
			if v == nil {
				continue
			}
			found = append(found, fmt.Sprintf("%s %s %s=%v", where, name, kind, *v))
			want, ok := goBounds[name][kind]
			switch {
			case !ok:
				t.Errorf("%s: %s has %s %v in openapi.yaml and no Go constant in goBounds: add the one that enforces it", where, name, kind, *v)
			case want != *v:
				t.Errorf("%s: %s has %s %v in openapi.yaml, but the Go constant is %v", where, name, kind, *v, want)
			}
			if seen[name] == nil {
				seen[name] = map[string]bool{}
			}
			seen[name][kind] = true
		}
	}
	var walk func(where, name string, ref *openapi3.SchemaRef, depth int)
	walk = func(where, name string, ref *openapi3.SchemaRef, depth int) {
		if ref == nil || ref.Value == nil || depth > 8 {
			return
		}
		s := ref.Value
		check(where, name, s)
		for pn, p := range s.Properties {
			if p.Ref == "" { // a $ref is walked where it is defined
				walk(where, pn, p, depth+1)
			}
		}
		if s.Items != nil && s.Items.Ref == "" {
			walk(where, name+"[]", s.Items, depth+1)
		}
		for _, sub := range slices.Concat(s.AllOf, s.OneOf, s.AnyOf) {
			if sub.Ref == "" {
				walk(where, name, sub, depth+1)
			}
		}
	}
	for name, s := range doc.Components.Schemas {
		walk("components.schemas."+name, "", s, 0)
	}
	for _, p := range doc.Components.Parameters {
		walk("components.parameters."+p.Value.Name, p.Value.Name, p.Value.Schema, 0)
	}
	for path, item := range doc.Paths.Map() {
		params := slices.Clone(item.Parameters)
		for method, op := range item.Operations() {
			for _, p := range slices.Concat(params, op.Parameters) {
				if p.Ref == "" {
					walk(method+" "+path, p.Value.Name, p.Value.Schema, 0)
				}
			}
			if op.RequestBody != nil && op.RequestBody.Ref == "" {
				for _, mt := range op.RequestBody.Value.Content {
					if mt.Schema != nil && mt.Schema.Ref == "" {
						walk(method+" "+path+" body", "", mt.Schema, 0)
					}
				}
			}
		}
	}
	if len(found) == 0 {
		t.Fatal("found no bound in openapi.yaml: the walk is broken")
	}
	for name, kinds := range goBounds {
		for kind := range kinds {
			if !seen[name][kind] {
				t.Errorf("goBounds has %s %s, which openapi.yaml no longer states: drop it, or restore the bound", name, kind)
			}
		}
	}
	if t.Failed() {
		slices.Sort(found)
		t.Logf("bounds in openapi.yaml:\n%s", strings.Join(found, "\n"))
	}
}
