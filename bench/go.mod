module github.com/narad-mq/narad/bench

go 1.24

require github.com/go-json-experiment/json v0.0.0-20250725192818-e39067aee2d2
