module github.com/narad-mq/narad/sdk-go/prometheus

go 1.24

require (
	github.com/narad-mq/narad/sdk-go v0.1.0
	github.com/prometheus/client_golang v1.23.2
)

require (
	github.com/apapsch/go-jsonmerge/v2 v2.0.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.5.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/oapi-codegen/runtime v1.1.2 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sys v0.35.0 // indirect
	google.golang.org/protobuf v1.36.8 // indirect
)

// In this repository the adapter builds against the SDK beside it (with or without
// go.work). Replace directives of a dependency are ignored, so a project that requires
// this module gets sdk-go v0.1.0 (tag sdk-go/v0.1.0) as required above.
replace github.com/narad-mq/narad/sdk-go => ../
