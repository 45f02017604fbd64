module github.com/narad-mq/narad/examples

go 1.24

require github.com/narad-mq/narad/sdk-go v0.0.0-00010101000000-000000000000

require (
	github.com/apapsch/go-jsonmerge/v2 v2.0.0 // indirect
	github.com/google/uuid v1.5.0 // indirect
	github.com/oapi-codegen/runtime v1.1.2 // indirect
)

// The examples build against the SDK in this repository (go.work says the same; the
// replace keeps `GOWORK=off go build` working too).
replace github.com/narad-mq/narad/sdk-go => ../sdk-go
