module github.com/narad-mq/narad/examples

go 1.24
