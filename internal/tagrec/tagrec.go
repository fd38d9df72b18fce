// Package tagrec is the record format that both followers (postgres,
// mysql) give a tag, the note a writing transaction carries of the keys
// its process's Loader added before the write, and the length-prefixed
// field it is made of, which package postgres also uses for its key
// tuples and its NOTIFY payloads.
//
// A field is "<len>:<bytes>", len in decimal; a tag's content is, for
// each key, the field of the run (which Follower run wrote it) and the
// field of the key's text. Contents concatenate: the tags of one
// transaction read as one.
package tagrec

import (
	"strconv"
	"strings"
)

// AppendField appends s to b as one field, "<len>:<s>".
func AppendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// CutField cuts one field from the front of s and returns its bytes and
// what follows it; ok is false if s does not begin with a whole field.
func CutField(s string) (field, rest string, ok bool) {
	n, tail, found := strings.Cut(s, ":")
	if !found {
		return "", "", false
	}
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l > len(tail) {
		return "", "", false
	}
	return tail[:l], tail[l:], true
}

// Append appends the record of one key, whose text is text, tagged by
// run.
func Append(b []byte, run, text string) []byte {
	return AppendField(AppendField(b, run), text)
}

// Own returns the keys that the records of contents (the tags of one
// transaction) name for run, parsed by parse, with how many times each,
// or nil if none does. Records of other runs, texts parse refuses, and
// the rest of a content from a record it cannot read on, name none.
func Own[K comparable](run string, contents []string, parse func(string) (K, error)) map[K]int {
	var own map[K]int
	for _, rest := range contents {
		for rest != "" {
			tag, after, ok := CutField(rest)
			if !ok {
				break
			}
			text, after, ok := CutField(after)
			if !ok {
				break
			}
			rest = after
			if tag != run {
				continue
			}
			k, err := parse(text)
			if err != nil {
				continue
			}
			if own == nil {
				own = make(map[K]int)
			}
			own[k]++
		}
	}
	return own
}
