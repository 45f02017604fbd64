package broker

import (
	"errors"
	"time"

	"github.com/narad-mq/narad/broker/internal/apigen"
)

// Limits of the API.
const (
	MaxTopicNameLen    = 249
	MaxPartitions      = 256
	MaxKeyBytes        = 1024
	MaxPayloadDepth    = 128 // nesting of a JSON payload's arrays and objects
	MaxVisibility      = 12 * time.Hour
	MinVisibility      = 100 * time.Millisecond
	MaxWait            = 20 * time.Second
	MaxBatch           = 1000
	MinRetentionMs     = 1000
	MaxRetentionMs     = 10 * 365 * 24 * 3600 * 1000
	MaxCapPerPartition = 1_000_000
	// MaxConsumeBytes bounds the key and payload bytes one consume-batch answer carries
	// (the first message always goes, whatever its size); messages past it stay queued.
	MaxConsumeBytes = 8 << 20
)

// ValidTopicName reports whether name follows the naming rules: 1 to 249 characters of
// a-z A-Z 0-9 . _ -, and not "." or "..".
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

func checkName(name string) error {
	if !ValidTopicName(name) {
		return invalid(apigen.ErrorCodeInvalidName, "topic name %q is invalid: use 1 to 249 characters of a-z A-Z 0-9 . _ - (not . or ..)", truncate(name, 64))
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
