package prometheus_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
	naradprom "github.com/narad-mq/narad/sdk-go/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsFromAClient drives a client against a stand-in broker (a produce that
// answers 202 after one 503) and checks the series the events produce.
func TestMetricsFromAClient(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		if calls == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(503)
			fmt.Fprint(w, `{"error":{"code":"acked_ahead_full","message":"later"}}`)
			return
		}
		w.WriteHeader(202)
		fmt.Fprint(w, `{"topic":"orders","partition":0,"offset":7}`)
	}))
	defer srv.Close()
	reg := prom.NewRegistry()
	m, err := naradprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := narad.New([]string{srv.URL}, narad.WithObserver(m.Observe))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Produce(context.Background(), "orders", "x"); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`
# HELP narad_client_requests_total HTTP attempts by operation, endpoint and status ("error" when no answer arrived).
# TYPE narad_client_requests_total counter
narad_client_requests_total{node=%q,op="produce",status="202"} 1
narad_client_requests_total{node=%q,op="produce",status="503"} 1
# HELP narad_client_retries_total Retries decided after a failed attempt, by operation.
# TYPE narad_client_retries_total counter
narad_client_retries_total{op="produce"} 1
# HELP narad_client_messages_produced_total Messages the broker confirmed as durable, by topic.
# TYPE narad_client_messages_produced_total counter
narad_client_messages_produced_total{topic="orders"} 1
`, srv.URL, srv.URL)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"narad_client_requests_total", "narad_client_retries_total", "narad_client_messages_produced_total"); err != nil {
		t.Fatal(err)
	}
}

func TestMetricsFromConsumerEvents(t *testing.T) {
	reg := prom.NewRegistry()
	m, err := naradprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs := narad.Observers(m.Observe, nil)
	obs(narad.Event{Kind: narad.EventReceive, Topic: "t", Messages: 3})
	obs(narad.Event{Kind: narad.EventProcess, Topic: "t", Duration: 20 * time.Millisecond})
	obs(narad.Event{Kind: narad.EventProcess, Topic: "t", Err: errors.New("x")})
	obs(narad.Event{Kind: narad.EventSettle, Topic: "t", Outcome: "ack"})
	obs(narad.Event{Kind: narad.EventSettle, Topic: "t", Outcome: "lost"})
	obs(narad.Event{Kind: narad.EventConsumerError, Topic: "t", Terminal: true})
	obs(narad.Event{Kind: narad.EventBreakerOpen, Node: "http://n1"})
	obs(narad.Event{Kind: narad.EventPublish, Topic: "t", Messages: 10})
	want := `
# HELP narad_client_messages_received_total Messages taken under a lease, by topic.
# TYPE narad_client_messages_received_total counter
narad_client_messages_received_total{topic="t"} 3
# HELP narad_client_messages_processed_total Handler runs of consumers, by topic and result (ok, error).
# TYPE narad_client_messages_processed_total counter
narad_client_messages_processed_total{result="error",topic="t"} 1
narad_client_messages_processed_total{result="ok",topic="t"} 1
# HELP narad_client_settlements_total Settlements made by consumers, by topic and outcome (ack, nack, lost, failed).
# TYPE narad_client_settlements_total counter
narad_client_settlements_total{outcome="ack",topic="t"} 1
narad_client_settlements_total{outcome="lost",topic="t"} 1
# HELP narad_client_consumer_errors_total Failures consumers survived (terminal=false) or stopped on (terminal=true), by topic.
# TYPE narad_client_consumer_errors_total counter
narad_client_consumer_errors_total{terminal="true",topic="t"} 1
# HELP narad_client_breaker_open 1 while an endpoint's circuit breaker keeps it out of the rotation.
# TYPE narad_client_breaker_open gauge
narad_client_breaker_open{node="http://n1"} 1
# HELP narad_client_publish_batches_total Batches sent by publishers, by topic and result (ok, error).
# TYPE narad_client_publish_batches_total counter
narad_client_publish_batches_total{result="ok",topic="t"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"narad_client_messages_received_total", "narad_client_messages_processed_total", "narad_client_settlements_total",
		"narad_client_consumer_errors_total", "narad_client_breaker_open", "narad_client_publish_batches_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "narad_client_handler_duration_seconds"); n != 1 {
		t.Fatalf("%d handler duration series", n)
	}
	if _, err := naradprom.New(reg); err == nil {
		t.Fatal("registering twice must fail")
	}
}
