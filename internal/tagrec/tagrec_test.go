package tagrec

import (
	"errors"
	"strconv"
	"testing"
)

func TestFieldsRoundTrip(t *testing.T) {
	for _, s := range []string{"", "a", "1:2", "::", "héllo", string([]byte{0, 255})} {
		b := AppendField([]byte("x"), s)
		got, rest, ok := CutField(string(b[1:]) + "tail")
		if !ok || got != s || rest != "tail" {
			t.Errorf("CutField(AppendField(%q)) = %q, %q, %v", s, got, rest, ok)
		}
	}
	for _, bad := range []string{"", "3", "-1:", "4:abc", "x:abc", "99999999999999999999:a"} {
		if f, rest, ok := CutField(bad); ok {
			t.Errorf("CutField(%q) = %q, %q, true; want not ok", bad, f, rest)
		}
	}
}

func TestOwn(t *testing.T) {
	parse := func(s string) (int, error) {
		if s == "bad" {
			return 0, errors.New("bad")
		}
		return strconv.Atoi(s)
	}
	a := Append(Append(Append(nil, "run1", "7"), "run2", "8"), "run1", "7")
	b := Append(Append(nil, "run1", "bad"), "run1", "9")
	got := Own("run1", []string{string(a), string(b) + "5:trunc"}, parse)
	if len(got) != 2 || got[7] != 2 || got[9] != 1 {
		t.Errorf("Own = %v, want map[7:2 9:1]", got)
	}
	if got := Own("run3", []string{string(a)}, parse); got != nil {
		t.Errorf("Own of another run = %v, want nil", got)
	}
}

func FuzzCutField(f *testing.F) {
	f.Add("3:abcrest")
	f.Add("0:")
	f.Add("12:")
	f.Fuzz(func(t *testing.T, s string) {
		field, rest, ok := CutField(s)
		if !ok {
			return
		}
		if got := string(AppendField(nil, field)) + rest; len(got) > len(s) || got[len(got)-len(rest):] != rest {
			t.Fatalf("CutField(%q) = %q, %q: not a prefix field and its rest", s, field, rest)
		}
	})
}
