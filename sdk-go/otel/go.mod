module github.com/narad-mq/narad/sdk-go/otel

go 1.24

require (
	github.com/narad-mq/narad/sdk-go v0.1.0
	go.opentelemetry.io/otel v1.38.0
	go.opentelemetry.io/otel/sdk v1.38.0
	go.opentelemetry.io/otel/trace v1.38.0
)

require (
	github.com/apapsch/go-jsonmerge/v2 v2.0.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/oapi-codegen/runtime v1.1.2 // indirect
	go.opentelemetry.io/auto/sdk v1.1.0 // indirect
	go.opentelemetry.io/otel/metric v1.38.0 // indirect
	golang.org/x/sys v0.35.0 // indirect
)

// In this repository the adapter builds against the SDK beside it (with or without
// go.work). Replace directives of a dependency are ignored, so a project that requires
// this module gets sdk-go v0.1.0 (tag sdk-go/v0.1.0) as required above.
replace github.com/narad-mq/narad/sdk-go => ../
