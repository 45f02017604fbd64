module github.com/narad-mq/narad/conformance

go 1.24

require (
	github.com/narad-mq/narad/sdk-go v0.0.0-00010101000000-000000000000
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/apapsch/go-jsonmerge/v2 v2.0.0 // indirect
	github.com/google/uuid v1.5.0 // indirect
	github.com/oapi-codegen/runtime v1.1.2 // indirect
)

replace github.com/narad-mq/narad/sdk-go => ../sdk-go
