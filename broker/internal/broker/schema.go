package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/jsondepth"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var english = message.NewPrinter(language.English)

// ErrSchemaViolation means a produced payload does not match the topic's schema; the
// SchemaError says where.
var ErrSchemaViolation = errors.New("schema violation")

// SchemaError is a payload that fails its topic's JSON Schema.
type SchemaError struct {
	Index    int    // message index within the request
	Location string // JSON pointer into the payload
	Reason   string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("message %d does not match the topic's schema at %s: %s", e.Index, e.Location, e.Reason)
}

func (e *SchemaError) Unwrap() error { return ErrSchemaViolation }

// Budgets of a topic's schema, checked when it is set (create or alter): over any of
// them is 400 schema_too_complex. They keep compiling and checking a schema cheap and
// refuse the shapes whose checking cost explodes.
const (
	MaxSchemaBytes    = 64 << 10 // the schema's JSON text
	MaxSchemaDepth    = 128      // nesting of the schema's JSON text
	MaxSchemaNodes    = 4096     // subschemas, booleans included
	MaxSchemaExpanded = 100_000  // subschemas with every $ref replaced by its target
	MaxSchemaPatterns = 256      // pattern and patternProperties regular expressions
	MaxPatternBytes   = 1024     // one regular expression
)

// Budgets of checking one produce request against its topic's schema: over either is
// 400 schema_too_complex and nothing is written. A step is one subschema applied to
// one value; matching a pattern costs one step per 64 bytes of the string too.
const (
	MaxValidationSteps = 1_000_000
	MaxValidationTime  = 3 * time.Second
)

// topicSchema is a topic's compiled schema. Checking a payload is metered, and the
// meter lives in the compiled form (the library gives no other hook), so one compiled
// copy serves one request at a time: idle copies wait in free, and a request that
// finds none compiles another.
type topicSchema struct {
	raw  json.RawMessage
	mu   sync.Mutex
	free []*schemaCopy
}

// maxIdleCopies bounds the compiled copies a topic keeps; more concurrent requests
// compile a copy each and drop it afterwards.
const maxIdleCopies = 8

// schemaCopy is one compiled copy of a topic's schema and the meter its hooks charge.
type schemaCopy struct {
	root *jsonschema.Schema
	m    *meter
}

// compileSchema checks and compiles a JSON Schema (draft 2020-12 unless it declares
// 2019-09). An empty or {} schema means no schema. References resolve only inside the
// schema document: no URL of any scheme is fetched or opened (see insideOnly).
func compileSchema(raw json.RawMessage) (*topicSchema, error) {
	if len(raw) > MaxSchemaBytes {
		return nil, invalid(apigen.ErrorCodeSchemaTooComplex, "the schema is %d bytes; the limit is %d", len(raw), MaxSchemaBytes)
	}
	if len(raw) == 0 || isEmptySchema(raw) {
		return nil, nil
	}
	if jsondepth.Exceeds(raw, MaxSchemaDepth) {
		return nil, invalid(apigen.ErrorCodeSchemaTooComplex, "the schema nests more than %d levels deep; flatten it with $defs and $ref", MaxSchemaDepth)
	}
	c, err := compileCopy(raw, true)
	if err != nil {
		return nil, err
	}
	ts := &topicSchema{raw: raw}
	ts.free = append(ts.free, c)
	return ts, nil
}

// compileCopy compiles raw into a metered copy; with check it also enforces the
// create-time budgets (a copy of a schema that passed them skips that walk).
func compileCopy(raw json.RawMessage, check bool) (*schemaCopy, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, invalid(apigen.ErrorCodeInvalidJson, "schema is not valid JSON: %v", err)
	}
	m := &meter{}
	m.reset(context.Background(), 1<<62, time.Time{})
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	loader := &insideOnly{}
	c.UseLoader(loader)
	re := &regexps{m: m}
	c.UseRegexpEngine(re.compile)
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, invalid(apigen.ErrorCodeBadRequest, "schema is not a valid JSON Schema: %v", err)
	}
	// Not {}: the library compiles an empty object to true, which skips extensions.
	if err := c.AddResource(stepURL, map[string]any{"$comment": "narad metering"}); err != nil {
		return nil, fmt.Errorf("adding the step schema: %w", err)
	}
	root, err := c.Compile(schemaURL)
	switch {
	case loader.refused != "":
		// The library's error would say how opening the URL failed; that is nothing a
		// caller may learn, and nothing was opened.
		return nil, invalid(apigen.ErrorCodeBadRequest, "the schema refers to %q, outside itself; only references inside the schema resolve (like \"#/$defs/name\"), nothing is fetched or read", loader.refused)
	case re.tooLong != "":
		return nil, invalid(apigen.ErrorCodeSchemaTooComplex, "the schema has a pattern of %d bytes (%.40q…); the limit is %d", len(re.tooLong), re.tooLong, MaxPatternBytes)
	case err != nil:
		return nil, invalid(apigen.ErrorCodeBadRequest, "schema is not a valid JSON Schema: %v", err)
	}
	step, err := c.Compile(stepURL)
	if err != nil {
		return nil, fmt.Errorf("compiling the step schema: %w", err)
	}
	g := graphOf(root)
	if check {
		if err := g.check(); err != nil {
			return nil, err
		}
	}
	g.instrument(step, m)
	return &schemaCopy{root: root, m: m}, nil
}

// schemaURL names a topic's schema document while it compiles; a reference that
// resolves to any other document is refused. stepURL names the metering schema (see
// instrument), out of the topic schema's reach.
const (
	schemaURL = "narad:///schema.json"
	stepURL   = "narad:///step.json"
)

// errOutside is what insideOnly answers for every URL.
var errOutside = errors.New("references outside the schema are not resolved")

// insideOnly is the compiler's loader: it refuses every URL. The library's default
// loader opens file:// URLs on the broker's host, so a schema could read the host's
// files (and block on a device) for anyone allowed to create a topic. The JSON Schema
// meta-schemas are built into the library and never reach a loader.
type insideOnly struct{ refused string }

func (l *insideOnly) Load(url string) (any, error) {
	if l.refused == "" {
		l.refused = url
	}
	return nil, errOutside
}

// regexps is the compiler's regular-expression engine: Go's (linear time), bounded in
// length, and metered when it matches. (It also compiles patterns when the library
// checks the schema against its meta-schema, so patterns are counted in the graph.)
type regexps struct {
	m       *meter
	tooLong string
}

var errPatternBudget = errors.New("over the pattern budget")

func (r *regexps) compile(s string) (jsonschema.Regexp, error) {
	if len(s) > MaxPatternBytes {
		if r.tooLong == "" {
			r.tooLong = s
		}
		return nil, errPatternBudget
	}
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, err
	}
	return meteredRegexp{re: re, m: r.m}, nil
}

// meteredRegexp charges the meter for the bytes it scans before scanning them.
type meteredRegexp struct {
	re *regexp.Regexp
	m  *meter
}

func (r meteredRegexp) MatchString(s string) bool {
	r.m.charge(1 + len(s)/64)
	return r.re.MatchString(s)
}

func (r meteredRegexp) String() string { return r.re.String() }

// meter counts the steps of one request's check and stops it (by panicking with
// meterStop, recovered in check) when the budget, the deadline or the request's
// context runs out.
type meter struct {
	ctx      context.Context
	deadline time.Time
	left     int
	tick     int
}

// meterStop carries why a check stopped through the library's frames.
type meterStop struct{ err error }

var (
	errStepBudget = errors.New("over the step budget")
	errTimeBudget = errors.New("over the time budget")
)

func (m *meter) reset(ctx context.Context, steps int, deadline time.Time) {
	m.ctx, m.left, m.deadline, m.tick = ctx, steps, deadline, 0
}

func (m *meter) charge(n int) {
	m.left -= n
	if m.left < 0 {
		panic(meterStop{errStepBudget})
	}
	// The clock and the context every 64 steps: a step is a microsecond or so.
	if m.tick += n; m.tick >= 64 {
		m.tick = 0
		if err := m.ctx.Err(); err != nil {
			panic(meterStop{err})
		}
		if !m.deadline.IsZero() && time.Now().After(m.deadline) {
			panic(meterStop{errTimeBudget})
		}
	}
}

// stepExt is the metering hook: the extension of the step schema, which every
// subschema refers to first.
type stepExt struct{ m *meter }

func (e stepExt) Validate(*jsonschema.ValidatorContext, any) { e.m.charge(1) }

// schemaGraph is a compiled schema's subschemas, each once.
type schemaGraph struct {
	root  *jsonschema.Schema
	nodes []*jsonschema.Schema
}

// sameValue lists the subschemas s applies to the value s itself applies to.
func sameValue(s *jsonschema.Schema) []*jsonschema.Schema {
	out := make([]*jsonschema.Schema, 0, 4)
	add := func(c *jsonschema.Schema) {
		if c != nil {
			out = append(out, c)
		}
	}
	add(s.Ref)
	add(s.RecursiveRef)
	if s.DynamicRef != nil {
		add(s.DynamicRef.Ref)
	}
	add(s.Not)
	add(s.If)
	add(s.Then)
	add(s.Else)
	out = append(out, s.AllOf...)
	out = append(out, s.AnyOf...)
	out = append(out, s.OneOf...)
	for _, d := range s.DependentSchemas {
		add(d)
	}
	for _, d := range s.Dependencies {
		if c, ok := d.(*jsonschema.Schema); ok {
			add(c)
		}
	}
	return out
}

// inner lists the subschemas s applies to values inside its value (members, items,
// property names, decoded content).
func inner(s *jsonschema.Schema) []*jsonschema.Schema {
	out := make([]*jsonschema.Schema, 0, len(s.Properties)+4)
	add := func(c *jsonschema.Schema) {
		if c != nil {
			out = append(out, c)
		}
	}
	add(s.PropertyNames)
	for _, c := range s.Properties {
		add(c)
	}
	for _, c := range s.PatternProperties {
		add(c)
	}
	if c, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		add(c)
	}
	add(s.UnevaluatedProperties)
	add(s.Contains)
	switch it := s.Items.(type) {
	case *jsonschema.Schema:
		add(it)
	case []*jsonschema.Schema:
		out = append(out, it...)
	}
	if c, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		add(c)
	}
	out = append(out, s.PrefixItems...)
	add(s.Items2020)
	add(s.UnevaluatedItems)
	add(s.ContentSchema)
	return out
}

func graphOf(root *jsonschema.Schema) *schemaGraph {
	g := &schemaGraph{root: root, nodes: []*jsonschema.Schema{root}}
	seen := map[*jsonschema.Schema]bool{root: true}
	for i := 0; i < len(g.nodes); i++ {
		s := g.nodes[i]
		for _, c := range append(sameValue(s), inner(s)...) {
			if !seen[c] {
				seen[c] = true
				g.nodes = append(g.nodes, c)
			}
		}
	}
	return g
}

// where names a subschema by its place in the topic's schema.
func where(s *jsonschema.Schema) string {
	loc := strings.TrimPrefix(s.Location, schemaURL)
	if loc == "" || loc == "#" {
		return "the root"
	}
	return loc
}

// check enforces the create-time budgets and refuses what can never validate.
func (g *schemaGraph) check() error {
	if len(g.nodes) > MaxSchemaNodes {
		return invalid(apigen.ErrorCodeSchemaTooComplex, "the schema has %d subschemas; the limit is %d", len(g.nodes), MaxSchemaNodes)
	}
	patterns := 0
	for _, s := range g.nodes {
		if s.Pattern != nil {
			patterns++
		}
		patterns += len(s.PatternProperties)
	}
	if patterns > MaxSchemaPatterns {
		return invalid(apigen.ErrorCodeSchemaTooComplex, "the schema has %d patterns (pattern and patternProperties); the limit is %d", patterns, MaxSchemaPatterns)
	}
	for _, s := range g.nodes {
		if s.Bool == nil && s.DraftVersion < 2019 {
			// Metering needs $ref beside other keywords, which drafts before 2019-09
			// ignore.
			return invalid(apigen.ErrorCodeBadRequest, "the schema at %s is JSON Schema draft %d; this broker takes draft 2020-12 (or 2019-09): drop or change $schema", where(s), s.DraftVersion)
		}
	}
	// A cycle of subschemas that apply to the same value never ends: the library fails
	// every payload on it. Cycles through members or items are recursion, bounded by
	// the payload's nesting.
	const (
		unseen = iota
		open
		done
	)
	state := make(map[*jsonschema.Schema]int, len(g.nodes))
	var cyc *jsonschema.Schema
	var visit func(s *jsonschema.Schema) bool
	visit = func(s *jsonschema.Schema) bool {
		state[s] = open
		for _, c := range sameValue(s) {
			switch state[c] {
			case open:
				cyc = c
				return true
			case unseen:
				if visit(c) {
					return true
				}
			}
		}
		state[s] = done
		return false
	}
	for _, s := range g.nodes {
		if state[s] == unseen && visit(s) {
			return invalid(apigen.ErrorCodeSchemaTooComplex, "the schema at %s refers back to itself without going into the payload's members or items; no payload could ever be checked against it", where(cyc))
		}
	}
	// Expanded size: what the schema would be with every reference replaced by its
	// target. References fan out: n levels that each refer to the next twice cost 2^n
	// for every payload. A reference back into a schema being expanded counts once.
	size := make(map[*jsonschema.Schema]int, len(g.nodes))
	onPath := make(map[*jsonschema.Schema]bool)
	var expand func(s *jsonschema.Schema) int
	expand = func(s *jsonschema.Schema) int {
		if n, ok := size[s]; ok {
			return n
		}
		if onPath[s] {
			return 1
		}
		onPath[s] = true
		n := 1
		for _, c := range append(sameValue(s), inner(s)...) {
			if n += expand(c); n > MaxSchemaExpanded {
				n = MaxSchemaExpanded + 1
				break
			}
		}
		onPath[s] = false
		size[s] = n
		return n
	}
	if n := expand(g.root); n > MaxSchemaExpanded {
		return invalid(apigen.ErrorCodeSchemaTooComplex, "the schema expands to more than %d subschemas when its $refs are followed (references that fan out, like anyOf alternatives that each refer to the next level); the limit is %d", MaxSchemaExpanded, MaxSchemaExpanded)
	}
	return nil
}

// instrument makes every subschema charge the meter before it does any work: each one
// refers first to the step schema, whose extension charges a step. The library runs
// $ref before the keywords beside it, while its extensions run last and are skipped
// when a subschema has already failed, so a failing branch would go uncounted. A
// subschema's own $ref moves to the end of its allOf, which means the same in draft
// 2019-09 and later: the target applies to the same value and its annotations count.
func (g *schemaGraph) instrument(step *jsonschema.Schema, m *meter) {
	step.Extensions = []jsonschema.SchemaExt{stepExt{m: m}}
	for _, s := range g.nodes {
		if s == step || s.Bool != nil {
			continue
		}
		if s.Ref != nil {
			s.AllOf = append(s.AllOf[:len(s.AllOf):len(s.AllOf)], s.Ref)
		}
		s.Ref = step
	}
}

func isEmptySchema(raw json.RawMessage) bool {
	var m map[string]any
	return json.Unmarshal(raw, &m) == nil && len(m) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// get takes an idle compiled copy or compiles one.
func (ts *topicSchema) get() (*schemaCopy, error) {
	ts.mu.Lock()
	if n := len(ts.free); n > 0 {
		c := ts.free[n-1]
		ts.free = ts.free[:n-1]
		ts.mu.Unlock()
		return c, nil
	}
	ts.mu.Unlock()
	return compileCopy(ts.raw, false)
}

func (ts *topicSchema) put(c *schemaCopy) {
	c.m.reset(context.Background(), 1<<62, time.Time{})
	ts.mu.Lock()
	if len(ts.free) < maxIdleCopies {
		ts.free = append(ts.free, c)
	}
	ts.mu.Unlock()
}

// checkAll validates a produce request's messages, within one budget of steps and
// time, and stops when ctx ends. It answers the first message that fails.
func (ts *topicSchema) checkAll(ctx context.Context, msgs []Outgoing) error {
	c, err := ts.get()
	if err != nil {
		return err
	}
	c.m.reset(ctx, MaxValidationSteps, time.Now().Add(MaxValidationTime))
	err = c.checkAll(msgs)
	// A copy stopped midway is as good as new: validation keeps no state in it.
	ts.put(c)
	return err
}

func (c *schemaCopy) checkAll(msgs []Outgoing) (err error) {
	defer func() {
		if r := recover(); r != nil {
			stop, ok := r.(meterStop)
			if !ok {
				panic(r)
			}
			switch {
			case errors.Is(stop.err, errStepBudget):
				err = invalid(apigen.ErrorCodeSchemaTooComplex, "checking this request against the topic's schema took more than %d steps; nothing was written. Send fewer or smaller messages per request, or simplify the schema (fewer anyOf/oneOf alternatives, fewer patterns)", MaxValidationSteps)
			case errors.Is(stop.err, errTimeBudget):
				err = invalid(apigen.ErrorCodeSchemaTooComplex, "checking this request against the topic's schema took more than %v; nothing was written. Send fewer or smaller messages per request, or simplify the schema (fewer anyOf/oneOf alternatives, fewer patterns)", MaxValidationTime)
			default:
				err = fmt.Errorf("checking the request against the topic's schema stopped: %w", stop.err)
			}
		}
	}()
	for i, m := range msgs {
		if err := checkSchema(c.root, i, m.Value, m.Attrs&PayloadKindMask == PayloadKindJSON); err != nil {
			return err
		}
	}
	return nil
}

// checkSchema validates one payload (JSON bytes) against s.
func checkSchema(s *jsonschema.Schema, index int, payload []byte, isJSON bool) error {
	if !isJSON {
		return &SchemaError{Index: index, Location: "/", Reason: "the payload is not JSON, and this topic has a JSON Schema"}
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &SchemaError{Index: index, Location: "/", Reason: "the payload is not valid JSON"}
	}
	if err := s.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			leaf := ve
			for len(leaf.Causes) > 0 {
				leaf = leaf.Causes[0]
			}
			return &SchemaError{Index: index, Location: "/" + strings.Join(leaf.InstanceLocation, "/"), Reason: leaf.ErrorKind.LocalizedString(english)}
		}
		return &SchemaError{Index: index, Location: "/", Reason: err.Error()}
	}
	return nil
}
