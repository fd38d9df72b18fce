package mysql

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// A keyForm turns a key column's values, as the table's read and the
// binlog give them and as callers write them, into one text per key: two
// texts are one text after canon exactly when the server's = takes them
// for one key.
type keyForm struct {
	kind   formKind
	column string
	bits   int  // integers: the type's width
	signed bool // integers
	pad    bool // text: a PAD SPACE collation (trailing spaces are ignored)
	mb3    bool // text: utf8mb3, which holds no 4-byte character
	w      *weights
	prec   int // DATETIME, TIME: the fraction digits it prints

	// ENUM: members[i] is the text of index i (the binlog's value), 0
	// being the error value ''; member maps the text form (as of a text
	// column of the ENUM's collation) of each to its text.
	members []string
	member  map[string]string
}

type formKind int

const (
	formInt formKind = iota
	formDecimal
	formBytes
	formText
	formDatetime
	formDate
	formTime
	formEnum
)

// canon returns the key's one text for text, a value of the column in
// any form the server reads as it, or an error for a text the form
// cannot judge (the lookup then goes to the store).
func (k *keyForm) canon(text string) (string, error) {
	switch k.kind {
	case formInt:
		if k.signed {
			v, err := strconv.ParseInt(text, 10, k.bits)
			if err != nil {
				return "", fmt.Errorf("mysql: key %q of %s: %w", text, k.column, err)
			}
			return strconv.FormatInt(v, 10), nil
		}
		v, err := strconv.ParseUint(text, 10, k.bits)
		if err != nil {
			return "", fmt.Errorf("mysql: key %q of %s: %w", text, k.column, err)
		}
		return strconv.FormatUint(v, 10), nil
	case formDecimal:
		return canonDecimal(text, k.column)
	case formBytes:
		return text, nil
	case formDatetime:
		return canonDatetime(text, k.prec, k.column)
	case formDate:
		return canonDate(text, k.column)
	case formTime:
		return canonTime(text, k.prec, k.column)
	case formEnum:
		form, err := k.textCanon(text)
		if err != nil {
			return "", err
		}
		if m, ok := k.member[form]; ok {
			return m, nil
		}
		// The server's = finds no row for a text no member equals (it
		// compares an ENUM with a text as text): form is no member's text
		// (a member's form is its own form's), so the guard does not hold
		// it, and reports it absent, as it is.
		return form, nil
	}
	return k.textCanon(text)
}

// textCanon is canon of a text column, or of an ENUM's texts.
func (k *keyForm) textCanon(text string) (string, error) {
	if !utf8.ValidString(text) {
		return "", fmt.Errorf("mysql: key %q of %s is not UTF-8", text, k.column)
	}
	if k.w == nil { // a _bin collation: code points as stored
		if k.mb3 && hasSupplementary(text) {
			return "", fmt.Errorf("mysql: key %q of %s has a 4-byte character, which utf8mb3 cannot hold", text, k.column)
		}
		if k.pad {
			text = strings.TrimRight(text, " ")
		}
		return text, nil
	}
	return k.w.canon(text, k.pad, k.mb3, k.column)
}

// fromRow returns the key's one text for a value of the column as the
// binlog decodes it; ok is false for NULL.
func (k *keyForm) fromRow(v any) (text string, ok bool, err error) {
	switch v := v.(type) {
	case nil:
		return "", false, nil
	case int64:
		if k.kind == formEnum {
			// An ENUM's index, as the binlog carries it.
			if v < 0 || v >= int64(len(k.members)) {
				return "", false, fmt.Errorf("mysql: the binlog gave %s index %d, of an ENUM of %d members", k.column, v, len(k.members)-1)
			}
			return k.members[v], true, nil
		}
		text = k.intText(v)
	case time.Time:
		if k.kind != formDatetime && k.kind != formDate {
			return "", false, fmt.Errorf("mysql: the binlog gave %s a value of type %T", k.column, v)
		}
		text = datetimeText(v, k.prec) // a parser that parses times; ours gives strings
	case string:
		text = strings.Clone(v) // the decoder's string may alias its buffer
	case []byte:
		text = string(v)
	case int8:
		text = k.intText(int64(v))
	case int16:
		text = k.intText(int64(v))
	case int32:
		text = k.intText(int64(v))
	default:
		return "", false, fmt.Errorf("mysql: the binlog gave %s a value of type %T", k.column, v)
	}
	text, err = k.canon(text)
	return text, err == nil, err
}

// intText writes an integer the binlog decoded as signed in the column's
// own signedness: without binlog_row_metadata=FULL the binlog does not
// say an integer is unsigned, the column's type does.
func (k *keyForm) intText(v int64) string {
	if k.signed || k.kind != formInt {
		return strconv.FormatInt(v, 10)
	}
	return strconv.FormatUint(uint64(v)&(1<<k.bits-1), 10)
}

// canonDecimal returns a decimal's text without a sign on zero, leading
// zeros, trailing zeros after the point, or a point with nothing after it:
// the server's = compares values, and a DECIMAL(10,2) column prints 1.5
// as 1.50.
func canonDecimal(text, col string) (string, error) {
	s := text
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = s[1:]
	}
	intPart, frac, hasPoint := strings.Cut(s, ".")
	if intPart == "" && frac == "" || !digits(intPart) || !digits(frac) || hasPoint && frac == "" && intPart == "" {
		return "", fmt.Errorf("mysql: key %q of %s is not a decimal number", text, col)
	}
	intPart = strings.TrimLeft(intPart, "0")
	frac = strings.TrimRight(frac, "0")
	if intPart == "" {
		intPart = "0"
	}
	out := intPart
	if frac != "" {
		out += "." + frac
	}
	if neg && out != "0" {
		out = "-" + out
	}
	return out, nil
}

func digits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func hasSupplementary(s string) bool {
	for _, r := range s {
		if r > 0xFFFF {
			return true
		}
	}
	return false
}

// intBits is the width of MySQL's integer types.
var intBits = map[string]int{"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "integer": 32, "bigint": 64}

// formOf returns the key form of column c, asking the server for its
// collation's weights (through load) when it has one that is not _bin.
// It returns an error wrapping ErrKeyType, which says what to do, for a
// column whose equality the guard cannot hold.
func formOf(c column, load func(collation string) (*weights, error)) (*keyForm, error) {
	k := &keyForm{column: c.name}
	refuse := func(why string) (*keyForm, error) {
		return nil, fmt.Errorf("%w: column %s (%s%s): %s", ErrKeyType, c.name, c.columnType, collationSays(c), why)
	}
	switch dt := c.dataType; {
	case intBits[dt] > 0:
		k.kind, k.bits, k.signed = formInt, intBits[dt], !strings.Contains(c.columnType, "unsigned")
	case dt == "decimal":
		k.kind = formDecimal
	case dt == "varbinary" || dt == "blob" || dt == "tinyblob" || dt == "mediumblob" || dt == "longblob":
		k.kind = formBytes
	case dt == "binary":
		// The binlog drops the zero bytes a BINARY(n) pads its value
		// with; a read gives them.
		return refuse("BINARY(n) is not supported yet: use VARBINARY(n)")
	case dt == "char" || dt == "varchar" || dt == "text" || dt == "tinytext" || dt == "mediumtext" || dt == "longtext":
		k.kind = formText
		if dt == "char" && strings.Contains(c.collation, "_nopad_") {
			// A CHAR loses its trailing spaces when read; under a NO PAD
			// collation they would count in a lookup.
			return refuse("CHAR under a NO PAD collation is not supported: use VARCHAR, or a PAD SPACE collation")
		}
		if why, err := k.textRule(c, load); why != "" || err != nil {
			if err != nil {
				return nil, err
			}
			return refuse(why)
		}
	case (dt == "datetime" || dt == "time") && strings.Contains(c.columnType, "mariadb-5.3"):
		// COLUMN_TYPE reads "time(3) /* mariadb-5.3 */": the column was
		// made while mysql56_temporal_format was OFF, and the binlog
		// carries its values in a layout the follower cannot decode.
		return refuse(fmt.Sprintf("it is stored in MariaDB 5.3's temporal format (%s), whose binlog values the follower cannot decode: SET GLOBAL mysql56_temporal_format = ON, then ALTER TABLE %s FORCE", c.columnType, c.table))
	case dt == "datetime" || dt == "time":
		k.kind = formDatetime
		if dt == "time" {
			k.kind = formTime
		}
		if p, ok := strings.CutPrefix(c.columnType, dt+"("); ok && len(p) == 2 && p[1] == ')' && p[0] >= '0' && p[0] <= '6' {
			k.prec = int(p[0] - '0')
		} else if c.columnType != dt {
			return refuse(fmt.Sprintf("its fraction digits are not %s(0) to %s(6)", strings.ToUpper(dt), strings.ToUpper(dt)))
		}
	case dt == "date":
		k.kind = formDate
	case dt == "timestamp":
		// The binlog carries a TIMESTAMP as seconds since the epoch; the
		// server reads a lookup's text in that session's time_zone, which
		// the guard cannot know (and a SYSTEM zone with summer time reads
		// one text as either of two instants in the hour it repeats).
		return refuse("TIMESTAMP is not supported: a lookup's text means an instant in its session's time_zone, which the guard cannot know; use DATETIME(p), with the times in UTC")
	case dt == "enum":
		k.kind = formEnum
		if why, err := k.textRule(c, load); why != "" || err != nil {
			if err != nil {
				return nil, err
			}
			return refuse(why)
		}
		ms, err := enumMembers(c.columnType)
		if err != nil {
			return refuse(fmt.Sprintf("its members cannot be read (%v): use members without a backslash, a '?' or a 4-byte character, or a VARCHAR", err))
		}
		k.members = append([]string{""}, ms...)
		k.member = make(map[string]string, len(k.members))
		for _, m := range k.members {
			form, err := k.textCanon(m)
			if err != nil {
				return refuse(fmt.Sprintf("member %q: %v", m, err))
			}
			if o, ok := k.member[form]; ok {
				// Two rows could hold one text (the server refuses two
				// members equal under the collation, not a member '' or
				// of spaces alone, equal to the error value).
				if o == "" {
					return refuse(fmt.Sprintf("member %q is one text with the error value '' (index 0) under its collation, and a delete of one row would drop the other's key: rename the member", m))
				}
				return refuse(fmt.Sprintf("members %q and %q are one text under its collation: rename one", o, m))
			}
			k.member[form] = m
		}
	case dt == "set":
		return refuse("SET is not supported: use an ENUM, or a VARCHAR")
	default:
		return refuse("this type is not supported yet: use an integer, DECIMAL, VARBINARY, a utf8mb4 VARCHAR, DATETIME, DATE, TIME or ENUM")
	}
	return k, nil
}

// textRule sets k's text equality from c's character set and collation,
// asking the server for the collation's weights (through load) when it is
// not _bin. why says why c cannot be followed.
func (k *keyForm) textRule(c column, load func(collation string) (*weights, error)) (why string, err error) {
	switch c.charset {
	case "utf8mb4":
	case "utf8mb3", "utf8":
		k.mb3 = true
	default:
		return "only utf8mb4 and utf8mb3 columns are supported: ALTER TABLE … MODIFY " + c.name + " … CHARACTER SET utf8mb4", nil
	}
	k.pad = !strings.Contains(c.collation, "_nopad_")
	if strings.HasSuffix(c.collation, "_bin") {
		return "", nil // code points as stored
	}
	w, err := load(c.collation)
	if err != nil {
		return "", fmt.Errorf("%w (column %s)", err, c.name)
	}
	k.w = w
	return "", nil
}

func collationSays(c column) string {
	if c.collation == "" {
		return ""
	}
	return " COLLATE " + c.collation
}
