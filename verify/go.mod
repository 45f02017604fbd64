module github.com/narad-mq/narad/verify

go 1.24

require github.com/anishathalye/porcupine v1.3.1

require golang.org/x/sys v0.35.0
