// Package jsondepth measures how deeply JSON text nests without decoding it. Decoders
// that recurse (Python's json, most validators) fail or slow down on deep nesting long
// before the text is large, so the broker bounds nesting where it accepts JSON.
package jsondepth

// Exceeds reports whether the JSON text b nests arrays and objects more than max levels
// deep. It makes one pass and allocates nothing. b should be valid JSON (check it
// first); for other input the answer is meaningless but Exceeds still returns.
func Exceeds(b []byte, max int) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			// Skip the string: brackets inside it do not nest.
			for i++; i < len(b); i++ {
				if c := b[i]; c == '\\' {
					i++
				} else if c == '"' {
					break
				}
			}
		case '[', '{':
			if depth++; depth > max {
				return true
			}
		case ']', '}':
			depth--
		}
	}
	return false
}
