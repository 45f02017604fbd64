module github.com/narad-mq/narad/bench

go 1.24
