package follow

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestTableIdentityRoundTrip(t *testing.T) {
	for _, i := range []TableIdentity{{}, {ID: 16384}, {Version: "v 1/2"}, {ID: 1<<40 + 7, Version: "16390:751"}} {
		back, err := ParseTableIdentity(i.String())
		if err != nil || back != i {
			t.Errorf("ParseTableIdentity(%q) = %+v, %v; want %+v", i.String(), back, err, i)
		}
	}
	for _, bad := range []string{"", "12", "x 1", "0 v", "-1 v", "12 "} {
		if i, err := ParseTableIdentity(bad); err == nil {
			t.Errorf("ParseTableIdentity(%q) = %+v, want an error", bad, i)
		}
	}
}

func TestCheckToken(t *testing.T) {
	for _, ok := range []string{"7380011122233344_5", "a", "my-db_1", strings.Repeat("x", 64)} {
		if err := CheckToken(ok); err != nil {
			t.Errorf("CheckToken(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", "a>", strings.Repeat("x", 65)} {
		if err := CheckToken(bad); err == nil {
			t.Errorf("CheckToken(%q) = nil, want an error", bad)
		}
	}
	if (Origin{}).String() != "no database" || !(Origin{}).IsZero() || !(Origin{Token: "a"}).Same(Origin{Token: "a", Name: "other name"}) {
		t.Error("Origin's zero value, or Same, is wrong")
	}
}

// lowerForm is a key form that makes texts lower case, and cannot judge
// one holding '?'.
type lowerForm struct{}

func (lowerForm) Key(s string) (string, error) {
	if strings.Contains(s, "?") {
		return "", errors.New("cannot judge")
	}
	return strings.ToLower(s), nil
}
func (lowerForm) Trivial() bool { return false }
func (lowerForm) Type() string  { return "citext" }

// column is a KeyColumn whose Read fails until it is given a form.
type column struct {
	form      KeyForm
	err       error
	composite bool
	reads     int
}

func (c *column) Read() (KeyForm, error) {
	c.reads++
	if c.form == nil {
		return nil, c.err
	}
	return c.form, nil
}
func (c *column) Composite() bool { return c.composite }

func TestTaggerForms(t *testing.T) {
	parse := func(s string) (string, error) { return s, nil }
	tags, err := NewTagger("", parse, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tags.Key("Ab"); !errors.Is(err, ErrKeyUnknown) {
		t.Fatalf("Key with no column = %v, want ErrKeyUnknown", err)
	}
	if rule := tags.KeyRule(); rule == nil {
		t.Fatal("a string key has no key rule")
	} else if k, err := rule("Ab"); err != nil || k != "Ab" {
		t.Fatalf("the key rule before the form is known = %q, %v; want the key as it is", k, err)
	}
	down := errors.New("database down")
	notFollowable := errors.New("not followable")
	col := &column{err: down}
	if err := tags.UseColumn(col, func(err error) bool { return errors.Is(err, notFollowable) }); err != nil {
		t.Fatalf("UseColumn of a database that does not answer = %v, want nil", err)
	}
	if _, err := tags.Key("Ab"); !errors.Is(err, ErrKeyUnknown) || !errors.Is(err, down) {
		t.Fatalf("Key while the database is down = %v, want ErrKeyUnknown wrapping its error", err)
	}
	col.form = lowerForm{}
	if k, err := tags.Key("Ab"); err != nil || k != "ab" {
		t.Fatalf("Key(Ab) = %q, %v; want ab", k, err)
	}
	if n := col.reads; n != 3 {
		t.Fatalf("%d reads of the column, want 3 (UseColumn, two Keys)", n)
	}
	if _, err := tags.Key("A?"); err == nil {
		t.Fatal("Key of a text the form cannot judge: no error")
	}
	if k, err := tags.KeyRule()("AB"); err != nil || k != "ab" {
		t.Fatalf("the key rule = %q, %v; want ab", k, err)
	}
	if _, err := tags.Content("t", "Ab"); err == nil || !strings.Contains(err.Error(), `canonical form is "ab"`) {
		t.Fatalf("Content of a key not in its canonical form = %v", err)
	}
	if _, err := tags.Content("t"); err == nil {
		t.Fatal("Content of no keys: no error")
	}
	content, err := tags.Content("t", "ab", "cd")
	if err != nil {
		t.Fatal(err)
	}
	own := tags.Own([][]byte{content})
	if len(own) != 2 || own["ab"] != 1 || own["cd"] != 1 {
		t.Fatalf("Own of its own tag = %v", own)
	}
	tags.NewRun()
	if own := tags.Own([][]byte{content}); own != nil {
		t.Fatalf("Own of an earlier run's tag = %v, want nil", own)
	}
	if err := tags.UseColumn(&column{err: notFollowable}, func(err error) bool { return errors.Is(err, notFollowable) }); !errors.Is(err, notFollowable) {
		t.Fatalf("UseColumn of a column that cannot be followed = %v", err)
	}
}

func TestTaggerKeysThatDoNotReadBack(t *testing.T) {
	tags, err := NewTagger("o", func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }, func(k int64) string { return "#" + strconv.FormatInt(k, 10) })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tags.Content("t", 7); err == nil || !strings.Contains(err.Error(), "does not read back") {
		t.Fatalf("Content of a key whose text does not parse back = %v", err)
	}
	if tags.KeyRule() != nil {
		t.Fatal("an integer key of one column has a key rule")
	}
	if _, err := NewTagger[string]("o", nil, nil); err == nil {
		t.Fatal("NewTagger without parse: no error")
	}
}
