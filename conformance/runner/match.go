package runner

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Match reports whether actual satisfies expected, where expected is a subset:
//   - a mapping matches when every key it names matches (actual may have more keys);
//   - a list matches a list of the same length element by element;
//   - a string starting with "~" is a regular expression over the actual value's text;
//   - numbers compare by value, whatever their Go type;
//   - a mapping with one "$" key is an operator: $len (a number, or an operator the
//     length must match, e.g. {$len: {$lte: 3}}), $gte, $lte, $gt, $lt, $any,
//     $absent (the key is missing or null), $present, $maxlen, $minlen, $contains (every listed item
//     matches some element, in any order), $oneof, $not, $ms (the value is a duration —
//     a number of milliseconds or text like "750", "1500ms", "2s" — and its milliseconds
//     match the argument, e.g. {$ms: {$gte: 500}}).
//
// The error says where the first mismatch is.
func Match(expected, actual any) error {
	return match("", normalize(expected), normalize(actual))
}

func match(path string, exp, act any) error {
	if m, ok := exp.(map[string]any); ok && len(m) == 1 {
		for k, v := range m {
			if strings.HasPrefix(k, "$") {
				return matchOp(path, k, v, act)
			}
		}
	}
	switch e := exp.(type) {
	case map[string]any:
		am, ok := act.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", where(path), show(act))
		}
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := e[k]
			av, present := am[k]
			if op, ok := v.(map[string]any); ok && len(op) == 1 {
				if _, abs := op["$absent"]; abs {
					if present && av != nil {
						return fmt.Errorf("%s: want absent, got %s", where(path+"."+k), show(av))
					}
					continue
				}
			}
			if !present {
				return fmt.Errorf("%s: missing", where(path+"."+k))
			}
			if err := match(path+"."+k, v, av); err != nil {
				return err
			}
		}
		return nil
	case []any:
		al, ok := act.([]any)
		if !ok {
			return fmt.Errorf("%s: want a list, got %s", where(path), show(act))
		}
		if len(al) != len(e) {
			return fmt.Errorf("%s: want %d items, got %d: %s", where(path), len(e), len(al), show(act))
		}
		for i := range e {
			if err := match(fmt.Sprintf("%s.%d", path, i), e[i], al[i]); err != nil {
				return err
			}
		}
		return nil
	case string:
		if strings.HasPrefix(e, "~") {
			re, err := regexp.Compile(e[1:])
			if err != nil {
				return fmt.Errorf("%s: bad regexp %q: %v", where(path), e, err)
			}
			if act == nil || !re.MatchString(text(act)) {
				return fmt.Errorf("%s: want /%s/, got %s", where(path), e[1:], show(act))
			}
			return nil
		}
		if s, ok := act.(string); !ok || s != e {
			return fmt.Errorf("%s: want %q, got %s", where(path), e, show(act))
		}
		return nil
	case float64:
		a, ok := act.(float64)
		if !ok || a != e {
			return fmt.Errorf("%s: want %v, got %s", where(path), e, show(act))
		}
		return nil
	default:
		if !reflect.DeepEqual(exp, act) {
			return fmt.Errorf("%s: want %s, got %s", where(path), show(exp), show(act))
		}
		return nil
	}
}

func matchOp(path, op string, arg, act any) error {
	num := func() (float64, float64, error) {
		a, ok1 := act.(float64)
		b, ok2 := arg.(float64)
		if !ok1 || !ok2 {
			return 0, 0, fmt.Errorf("%s: %s needs numbers, got %s", where(path), op, show(act))
		}
		return a, b, nil
	}
	switch op {
	case "$ms":
		ms, ok := durationMs(act)
		if !ok {
			return fmt.Errorf("%s: $ms needs a duration, got %s", where(path), show(act))
		}
		return match(path, arg, ms)
	case "$any":
		return nil
	case "$present":
		if act == nil {
			return fmt.Errorf("%s: want a value, got null", where(path))
		}
		return nil
	case "$absent":
		if act != nil {
			return fmt.Errorf("%s: want absent, got %s", where(path), show(act))
		}
		return nil
	case "$len", "$maxlen", "$minlen":
		n := -1
		switch a := act.(type) {
		case []any:
			n = len(a)
		case map[string]any:
			n = len(a)
		case string:
			n = len(a)
		}
		if sub, isOp := arg.(map[string]any); isOp && op == "$len" && n >= 0 {
			// {$len: {$lte: 3}}: the length matched against an operator.
			if err := match(path, sub, float64(n)); err != nil {
				return fmt.Errorf("%s: length %d: %w", where(path), n, err)
			}
			return nil
		}
		want, isNum := arg.(float64)
		if !isNum {
			return fmt.Errorf("%s: %s takes a number or an operator, not %s (a scenario error)", where(path), op, show(arg))
		}
		ok := map[string]bool{"$len": float64(n) == want, "$maxlen": float64(n) <= want, "$minlen": float64(n) >= want}[op]
		if n < 0 || !ok {
			return fmt.Errorf("%s: want %s %v, got %s", where(path), op, arg, show(act))
		}
		return nil
	case "$gte", "$lte", "$gt", "$lt":
		a, b, err := num()
		if err != nil {
			return err
		}
		ok := map[string]bool{"$gte": a >= b, "$lte": a <= b, "$gt": a > b, "$lt": a < b}[op]
		if !ok {
			return fmt.Errorf("%s: want %s %v, got %v", where(path), op, b, a)
		}
		return nil
	case "$contains":
		al, ok := act.([]any)
		if !ok {
			return fmt.Errorf("%s: $contains needs a list, got %s", where(path), show(act))
		}
		items, _ := arg.([]any)
		for i, it := range items {
			found := false
			for _, a := range al {
				if match(path, it, a) == nil {
					found = true
					break
				}
			}
			if !found {
				return fmt.Errorf("%s: no element matches item %d %s in %s", where(path), i, show(it), show(act))
			}
		}
		return nil
	case "$oneof":
		items, _ := arg.([]any)
		for _, it := range items {
			if match(path, it, act) == nil {
				return nil
			}
		}
		return fmt.Errorf("%s: %s matches none of %s", where(path), show(act), show(arg))
	case "$not":
		if match(path, arg, act) == nil {
			return fmt.Errorf("%s: %s must not match %s", where(path), show(act), show(arg))
		}
		return nil
	}
	return fmt.Errorf("%s: unknown operator %s", where(path), op)
}

func where(path string) string {
	if path == "" {
		return "(top)"
	}
	return strings.TrimPrefix(path, ".")
}

func text(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// normalize turns YAML and JSON decodings into one shape: map[string]any, []any,
// float64 numbers, strings, bools and nil.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case int32:
		return float64(x)
	case uint64:
		return float64(x)
	case float32:
		return float64(x)
	case json.Number:
		f, _ := x.Float64()
		return f
	}
	return v
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z0-9_.\-]+)\}`)

// Expand replaces ${name.path} references in every string of v with values from vars.
// A string that is exactly one reference becomes the value itself (a number stays a
// number); references inside longer strings are replaced by the value's text.
func Expand(v any, vars map[string]any) (any, error) {
	switch x := v.(type) {
	case string:
		if m := varRef.FindStringSubmatch(x); m != nil && m[0] == x {
			return lookup(vars, m[1])
		}
		var firstErr error
		out := varRef.ReplaceAllStringFunc(x, func(ref string) string {
			val, err := lookup(vars, ref[2:len(ref)-1])
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return ref
			}
			return text(val)
		})
		return out, firstErr
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ev, err := Expand(e, vars)
			if err != nil {
				return nil, err
			}
			out[k] = ev
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			ev, err := Expand(e, vars)
			if err != nil {
				return nil, err
			}
			out[i] = ev
		}
		return out, nil
	}
	return v, nil
}

func lookup(vars map[string]any, path string) (any, error) {
	parts := strings.Split(path, ".")
	cur, ok := vars[parts[0]]
	if !ok {
		return nil, fmt.Errorf("unknown variable ${%s}", path)
	}
	cur = normalize(cur)
	for _, p := range parts[1:] {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[p]
			if !ok {
				return nil, fmt.Errorf("${%s}: no %q", path, p)
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("${%s}: no item %q", path, p)
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("${%s}: %q of a %T", path, p, cur)
		}
	}
	return cur, nil
}

// durationMs reads a duration in milliseconds from a number or a text: digits are
// milliseconds, otherwise a Go duration ("1500ms", "2s").
func durationMs(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case string:
		if f, err := strconv.ParseFloat(x, 64); err == nil {
			return f, true
		}
		if d, err := time.ParseDuration(x); err == nil {
			return float64(d) / float64(time.Millisecond), true
		}
	}
	return 0, false
}
