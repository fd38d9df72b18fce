package mysql

import (
	"fmt"
	"strings"
)

// enumMembers returns the members of an ENUM column from its COLUMN_TYPE,
// such as enum('a','B') with a quote in a member doubled, in their order:
// the binlog carries a member's 1-based index. It returns an error for a member with a
// backslash, which the server writes in COLUMN_TYPE escaped in a way the
// guard does not read yet.
func enumMembers(columnType string) ([]string, error) {
	s, ok := strings.CutPrefix(columnType, "enum(")
	if !ok || !strings.HasSuffix(s, ")") {
		return nil, fmt.Errorf("not enum('…',…)")
	}
	s = s[:len(s)-1]
	if strings.Contains(s, `\`) {
		return nil, fmt.Errorf("a member has a backslash")
	}
	if strings.Contains(s, "?") {
		// information_schema (and SHOW CREATE TABLE) write a 4-byte
		// character of a member as '?': the row's text is not the one
		// read here.
		return nil, fmt.Errorf("a member has a '?', which is how the server writes a 4-byte character in COLUMN_TYPE")
	}
	var out []string
	for s != "" {
		if s[0] != '\'' {
			return nil, fmt.Errorf("a member is not quoted")
		}
		var b strings.Builder
		i := 1
		for {
			j := strings.IndexByte(s[i:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("a member is not closed")
			}
			b.WriteString(s[i : i+j])
			i += j + 1
			if i < len(s) && s[i] == '\'' { // a quote, doubled
				b.WriteByte('\'')
				i++
				continue
			}
			break
		}
		out = append(out, b.String())
		s = s[i:]
		if s != "" {
			if s[0] != ',' || len(s) == 1 {
				return nil, fmt.Errorf("members are not separated by commas")
			}
			s = s[1:]
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no member")
	}
	return out, nil
}
