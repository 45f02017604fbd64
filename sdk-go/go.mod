module github.com/narad-mq/narad/sdk-go

go 1.24

require github.com/oapi-codegen/runtime v1.1.2

require (
	github.com/apapsch/go-jsonmerge/v2 v2.0.0 // indirect
	github.com/google/uuid v1.5.0 // indirect
)
