package broker

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
	"github.com/narad-mq/narad/broker/internal/auth"
)

// Limits of the API. Each is defined here once: the checks, the messages that name
// them and the command's flag validation all use these constants, and a test of httpapi
// holds openapi.yaml's bounds equal to them.
const (
	// MaxTopicNameLen is the longest topic name: a Kafka-compatible bound that keeps a
	// topic's directory name within every file system's 255 bytes.
	MaxTopicNameLen = 249
	// MaxPartitions is the most partitions a topic has.
	MaxPartitions = 256
	// MaxKeyBytes is the longest message key.
	MaxKeyBytes = 1024
	// MaxPayloadDepth is the deepest nesting of a JSON payload's arrays and objects:
	// recursive decoders in the SDKs' languages give up on much deeper ones.
	MaxPayloadDepth = 128
	// MinVisibility and MaxVisibility bound a lease (a topic's visibility timeout and an
	// ack's extend).
	MinVisibility = 100 * time.Millisecond
	MaxVisibility = 12 * time.Hour
	// MaxWait is the longest a consume waits for its first message.
	MaxWait = 20 * time.Second
	// MaxBatch is the most messages or acks one batch request carries or returns.
	MaxBatch = 1000
	// MinRetentionMs and MaxRetentionMs bound a topic's retention.
	MinRetentionMs = 1000
	MaxRetentionMs = 10 * 365 * 24 * 3600 * 1000
	// MaxCapPerPartition bounds a topic's in-flight and acked-ahead caps per partition.
	MaxCapPerPartition = 1_000_000
	// MaxFanoutDelayMs is the longest delay of a delay child (a year).
	MaxFanoutDelayMs = 365 * 24 * 3600 * 1000
	// MaxConsumeBytes bounds the key and payload bytes one consume-batch answer carries
	// (the first message always goes, whatever its size); messages past it stay queued.
	MaxConsumeBytes = 8 << 20
)

// ShortDuration writes a limit's duration the way messages and flags spell it: 12h,
// 20s, 100ms (time.Duration.String would write 12h0m0s).
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ValidTopicName reports whether name follows the naming rules: 1 to MaxTopicNameLen
// characters of a-z A-Z 0-9 . _ -, and not "." or "..".
func ValidTopicName(name string) bool {
	if len(name) == 0 || len(name) > MaxTopicNameLen || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// TopicNameRule and UsernameRule say what a valid topic name and username are, as
// the invalid_name answers put it.
var (
	TopicNameRule = fmt.Sprintf("use 1 to %d characters of a-z A-Z 0-9 . _ - (not . or ..)", MaxTopicNameLen)
	UsernameRule  = fmt.Sprintf("use 1 to %d characters of a-z A-Z 0-9 . _ - @", auth.MaxUsernameLen)
)

func checkName(name string) error {
	if !ValidTopicName(name) {
		return invalid(apigen.ErrorCodeInvalidName, "topic name %q is invalid: %s", truncate(name, 64), TopicNameRule)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func checkRange[T int32 | int64](field string, v *T, lo, hi T) error {
	if v != nil && (*v < lo || *v > hi) {
		return invalid(apigen.ErrorCodeInvalidParameter, "%s must be between %d and %d, got %d", field, lo, hi, *v)
	}
	return nil
}

func checkSettings(retention, visibility *int64, inFlight, ackedAhead *int32) error {
	return errors.Join(
		checkRange("retention_ms", retention, MinRetentionMs, MaxRetentionMs),
		checkRange("visibility_timeout_ms", visibility, int64(MinVisibility/time.Millisecond), int64(MaxVisibility/time.Millisecond)),
		checkRange("max_in_flight_per_partition", inFlight, 1, MaxCapPerPartition),
		checkRange("max_acked_ahead_per_partition", ackedAhead, 1, MaxCapPerPartition),
	)
}

func firstInvalid(err error) error {
	if err == nil {
		return nil
	}
	var inv *InvalidError
	if errors.As(err, &inv) {
		return inv
	}
	return err
}
