package shard

import (
	"strings"
	"testing"
)

// TestEncodeNilArguments: WriteTo and ReadFrom name a nil writer or
// reader instead of panicking.
func TestEncodeNilArguments(t *testing.T) {
	s, err := New(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteTo(nil); err == nil || !strings.Contains(err.Error(), "writer") {
		t.Fatalf("WriteTo(nil) = %v, want an error naming the writer", err)
	}
	if _, err := s.ReadFrom(nil); err == nil || !strings.Contains(err.Error(), "reader") {
		t.Fatalf("ReadFrom(nil) = %v, want an error naming the reader", err)
	}
}
