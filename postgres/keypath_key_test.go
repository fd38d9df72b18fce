package postgres

import (
	"strconv"
	"testing"
)

// The key functions of BenchmarkKeyPath: a Tagger's Key for a column of
// each type, as a Follower's Key after its first session.

func benchTagger[K comparable](b *testing.B, base string, parse func(string) (K, error)) func(string) (K, error) {
	tags, err := newTagger("bench", parse, nil)
	if err != nil {
		b.Fatal(err)
	}
	rule, err := keyRuleFor(keyColumn{schema: "pg_catalog", base: base, deterministic: true}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	tags.setRule(rule)
	return tags.Key
}

func benchKeyUUID(b *testing.B) func(string) (string, error) {
	return benchTagger(b, "uuid", func(s string) (string, error) { return s, nil })
}

func benchKeyInt(b *testing.B) func(string) (int64, error) {
	return benchTagger(b, "int8", func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
}

func benchKeyText(b *testing.B) func(string) (string, error) {
	return benchTagger(b, "text", func(s string) (string, error) { return s, nil })
}
