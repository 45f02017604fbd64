module github.com/narad-mq/narad/conformance

go 1.24
