// Package otel traces the Narad Go SDK with OpenTelemetry, following the messaging
// semantic conventions: "send" spans for produce requests (kind producer), "receive" for
// polls and "settle" for acks, nacks and renewals (kind client), and "process" spans
// around handlers (kind consumer). The trace context travels inside the opt-in
// narad.Envelope (traceparent, tracestate), so a consumer's process span continues the
// producer's trace.
//
//	t := otel.New()
//	c, _ := narad.New(endpoints, narad.WithObserver(t.Observe))
//	env, _ := narad.NewEnvelope(order)
//	t.Inject(ctx, env)
//	c.Produce(ctx, "orders", env)
//	...
//	c.Consume(ctx, "orders", t.Handler(handle))
//
// It plugs into the SDK's one event hook, so the core SDK stays free of the dependency.
package otel

import (
	"context"
	"errors"
	"net/url"
	"strconv"

	narad "github.com/narad-mq/narad/sdk-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/narad-mq/narad/sdk-go/otel"

// Tracer makes spans from the SDK's events and handlers. Make it with New.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// Option configures a Tracer.
type Option func(*options)

type options struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

// WithTracerProvider uses tp instead of the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithPropagator uses p instead of W3C trace context to carry the context in envelopes.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(o *options) { o.prop = p }
}

// New returns a Tracer on the global TracerProvider and W3C trace context, unless
// options say otherwise.
func New(opts ...Option) *Tracer {
	o := options{tp: otel.GetTracerProvider(), prop: propagation.TraceContext{}}
	for _, f := range opts {
		f(&o)
	}
	return &Tracer{tracer: o.tp.Tracer(ScopeName), prop: o.prop}
}

// Observe turns request and poll events into spans; pass it to narad.WithObserver
// (alone or in narad.Observers).
func (t *Tracer) Observe(e narad.Event) {
	var opType string
	kind := trace.SpanKindClient
	switch {
	case e.Kind == narad.EventRequest && (e.Op == "produce" || e.Op == "produce-batch"):
		opType, kind = "send", trace.SpanKindProducer
	case e.Kind == narad.EventRequest && (e.Op == "ack" || e.Op == "ack-batch" || e.Op == "nack" || e.Op == "extend"):
		opType = "settle"
	case e.Kind == narad.EventReceive:
		opType = "receive"
	default:
		return
	}
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "narad"),
		attribute.String("messaging.operation.type", opType),
		attribute.String("messaging.operation.name", e.Op),
		attribute.String("messaging.destination.name", e.Topic),
	}
	if e.Messages != 1 && (e.Op == "produce-batch" || e.Op == "consume-batch" || e.Op == "ack-batch") {
		attrs = append(attrs, attribute.Int("messaging.batch.message_count", e.Messages))
	}
	if u, err := url.Parse(e.Node); err == nil && u.Host != "" {
		attrs = append(attrs, attribute.String("server.address", u.Hostname()))
		if p, err := strconv.Atoi(u.Port()); err == nil {
			attrs = append(attrs, attribute.Int("server.port", p))
		}
	}
	if e.Status != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", e.Status))
	}
	if e.Attempt > 1 {
		attrs = append(attrs, attribute.Int("narad.attempt", e.Attempt))
	}
	_, span := t.tracer.Start(ctx, opType+" "+e.Topic, trace.WithSpanKind(kind), trace.WithTimestamp(e.Start), trace.WithAttributes(attrs...))
	if e.Err != nil {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
		span.SetAttributes(attribute.String("error.type", errorType(e.Err)))
	}
	span.End(trace.WithTimestamp(e.Start.Add(e.Duration)))
}

func errorType(err error) string {
	var ne *narad.Error
	if errors.As(err, &ne) && ne.Code != "" {
		return ne.Code
	}
	return "error"
}

// Handler wraps h with a "process" span per message. When the message carries an
// envelope with a trace context, the span continues the producer's trace and links the
// consumer's context; otherwise it is a child of the handler's context. The handler's
// context carries the span, so work it does joins the trace.
func (t *Tracer) Handler(h narad.Handler) narad.Handler {
	return func(ctx context.Context, m *narad.Message) error {
		attrs := []attribute.KeyValue{
			attribute.String("messaging.system", "narad"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.destination.name", m.Topic),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(m.Partition))),
			attribute.Int64("messaging.narad.message.offset", m.Offset),
			attribute.Int("messaging.narad.message.delivery_attempt", m.DeliveryAttempt),
		}
		parent := ctx
		var links []trace.Link
		env := m.Envelope()
		if env == nil {
			env, _ = narad.OpenEnvelope(m)
		}
		if env != nil {
			attrs = append(attrs, attribute.String("messaging.message.id", env.ID))
			if pctx := t.Extract(ctx, env); trace.SpanContextFromContext(pctx).IsValid() {
				if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
					links = append(links, trace.Link{SpanContext: sc})
				}
				parent = pctx
			}
		}
		sctx, span := t.tracer.Start(parent, "process "+m.Topic, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attrs...), trace.WithLinks(links...))
		defer span.End()
		err := h(sctx, m)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(attribute.String("error.type", errorType(err)))
		}
		return err
	}
}

// Inject writes the trace context of ctx into env (TraceParent, TraceState), so that the
// consumer's process span continues this trace.
func (t *Tracer) Inject(ctx context.Context, env *narad.Envelope) {
	t.prop.Inject(ctx, envelopeCarrier{env})
}

// Extract returns ctx with the trace context carried by env as its remote parent.
func (t *Tracer) Extract(ctx context.Context, env *narad.Envelope) context.Context {
	return t.prop.Extract(ctx, envelopeCarrier{env})
}

// NewEnvelope wraps body in a new envelope carrying the trace context of ctx.
func (t *Tracer) NewEnvelope(ctx context.Context, body any) (*narad.Envelope, error) {
	env, err := narad.NewEnvelope(body)
	if err != nil {
		return nil, err
	}
	t.Inject(ctx, env)
	return env, nil
}

// envelopeCarrier maps the W3C header names onto the envelope's trace fields.
type envelopeCarrier struct{ e *narad.Envelope }

func (c envelopeCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.e.TraceParent
	case "tracestate":
		return c.e.TraceState
	}
	return c.e.Headers[key]
}

func (c envelopeCarrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.e.TraceParent = value
	case "tracestate":
		c.e.TraceState = value
	default:
		c.e.SetHeader(key, value)
	}
}

func (c envelopeCarrier) Keys() []string {
	keys := []string{"traceparent", "tracestate"}
	for k := range c.e.Headers {
		keys = append(keys, k)
	}
	return keys
}
