module github.com/narad-mq/narad/verify

go 1.24
