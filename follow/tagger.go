package follow

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cuckooguard/cuckooguard/internal/tagrec"
)

// ErrKeyUnknown is returned by [Tagger.Key] before the key column's form
// is known: the database has not answered yet.
var ErrKeyUnknown = errors.New("follow: the key column's form is not known yet")

// A KeyForm is a key column's equality as the guard holds it: one text
// for every text the database reads as the same key.
type KeyForm interface {
	// Key returns the canonical form of text, a key written in any form
	// the database reads, or an error where it cannot tell which key it
	// is (the lookup then goes to the store).
	Key(text string) (string, error)
	// Trivial reports whether every text is its own form.
	Trivial() bool
	// Type names the column's type (and collation), for messages.
	Type() string
}

// A KeyColumn is where a [Tagger] reads its key column's form.
type KeyColumn interface {
	// Read reads the column's form through a connection of its own,
	// within its own deadline.
	Read() (KeyForm, error)
	// Composite reports whether the key is of several columns.
	Composite() bool
}

// A Tagger writes and reads the tags of one follower's run: records in a
// writing transaction that name the keys it creates through the
// follower's Loader, so that the follower skips exactly those inserts
// when they come back in the change stream, and knows its key column's
// form ([Tagger.Key], [Tagger.KeyRule]). A Tagger is safe for concurrent
// use.
type Tagger[K comparable] struct {
	origin string
	run    atomic.Pointer[string] // "<origin> <random>": this run's tag
	parse  func(string) (K, error)
	text   func(K) string

	form   atomic.Pointer[formBox] // the key column's form; nil until read
	col    KeyColumn               // where Key reads it while form is nil; nil: nowhere
	readMu sync.Mutex              // held while Key reads it
}

type formBox struct{ f KeyForm }

// NewTagger returns the Tagger of a run of the follower named origin
// (any name; "" is fine), whose keys read back from their text with parse
// and are written as text by text (nil: [KeyText]).
func NewTagger[K comparable](origin string, parse func(string) (K, error), text func(K) string) (*Tagger[K], error) {
	if parse == nil {
		return nil, errors.New("follow: NewTagger needs a parse function")
	}
	if text == nil {
		text = KeyText[K]()
	}
	t := &Tagger[K]{origin: cmp.Or(origin, "-"), parse: parse, text: text}
	t.NewRun()
	return t, nil
}

// KeyText returns the default text form of keys of type K: a string as
// it is, an integer in decimal, and anything else as fmt.Sprint prints it
// (a fmt.Stringer's String, such as a UUID's).
func KeyText[K comparable]() func(K) string {
	var zero K
	switch any(zero).(type) {
	case string:
		return func(k K) string { return any(k).(string) }
	case int64:
		return func(k K) string { return strconv.FormatInt(any(k).(int64), 10) }
	case uint64:
		return func(k K) string { return strconv.FormatUint(any(k).(uint64), 10) }
	}
	return func(k K) string { return fmt.Sprint(k) }
}

// Text returns k's text.
func (t *Tagger[K]) Text(k K) string { return t.text(k) }

// Run returns the current run's name, which the tags of this run carry.
func (t *Tagger[K]) Run() string { return *t.run.Load() }

// NewRun starts another run: tags written from now on are told apart from
// the earlier ones, whose inserts the follower applies rather than skips
// (a restarted process's guard may lack the keys an earlier run added, and
// a guard swapped in lacks those added to the one it replaced).
func (t *Tagger[K]) NewRun() {
	t.run.Store(new(fmt.Sprintf("%s %x", t.origin, rand.Uint64())))
}

// Content returns what a tag of keys by this run says: for each key,
// "<len>:<run><len>:<key text>". Records concatenate, so that the tags of
// one transaction can be read as one. It returns an error for no keys, a
// key not in its column's canonical form, or a key that does not read back
// from its text; what names the caller in the errors ("postgres: Tag").
func (t *Tagger[K]) Content(what string, keys ...K) ([]byte, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: no keys: name the keys the transaction creates through the Loader", what)
	}
	var b []byte
	form := t.Form()
	run := t.Run()
	for _, k := range keys {
		text := t.text(k)
		if form != nil {
			if c, err := form.Key(text); err != nil || c != text {
				if err == nil {
					err = fmt.Errorf("its canonical form is %q", c)
				}
				return nil, fmt.Errorf("%s: key %v is not in the canonical form of its column's type %s (%v): the Loader would hold a form that no lookup through Key asks for; give the Loader the key that Key returns", what, k, form.Type(), err)
			}
		}
		if back, err := t.parse(text); err != nil || back != k {
			if err == nil {
				err = fmt.Errorf("it parses as %v", back)
			}
			return nil, fmt.Errorf("%s: key %v does not read back from its text %q (%v): the follower could not tell its insert from another key's; give the Loader keys in the form the table stores and parse returns, or set WithKeyText", what, k, text, err)
		}
		b = tagrec.Append(b, run, text)
	}
	return b, nil
}

// Own returns the keys that the tags of one transaction name for this
// run, with how many times each, or nil if none does. Tags of other
// followers and earlier runs, and tags it cannot read, name none.
func (t *Tagger[K]) Own(tags [][]byte) map[K]int {
	if len(tags) == 0 {
		return nil
	}
	contents := make([]string, len(tags))
	for i, c := range tags {
		contents[i] = string(c)
	}
	return tagrec.Own(t.Run(), contents, t.parse)
}

// UseColumn makes the Tagger's keys those of col: [Tagger.Key] returns
// their canonical form, and [Tagger.Content] refuses a key in another
// form. It reads the form now and returns the error of a column the guard
// cannot follow (for which notFollowable reports true); a database that
// does not answer is no error: Key reads the form at its first call
// after, and returns [ErrKeyUnknown] until it can. A follower calls it
// from its constructor.
func (t *Tagger[K]) UseColumn(col KeyColumn, notFollowable func(error) bool) error {
	if col == nil {
		return errors.New("follow: Tagger.UseColumn needs a column")
	}
	t.col = col
	f, err := col.Read()
	switch {
	case err != nil && notFollowable(err):
		return err
	case err == nil:
		t.SetForm(f)
	}
	return nil
}

// SetColumn makes col the Tagger's column without reading it: Key reads
// its form at its first call, and a follower's session sets it
// ([Tagger.SetForm]).
func (t *Tagger[K]) SetColumn(col KeyColumn) { t.col = col }

// SetForm makes f the key column's form: a follower's session read it.
func (t *Tagger[K]) SetForm(f KeyForm) { t.form.Store(&formBox{f}) }

// Form returns the key column's form, or nil if it is not known yet.
func (t *Tagger[K]) Form() KeyForm {
	if b := t.form.Load(); b != nil {
		return b.f
	}
	return nil
}

// Key returns the key that the guard holds for text, a key of the
// followed column written in any form the database reads as it: parse of
// the text's canonical form. It returns an error wrapping [ErrKeyUnknown]
// before the column's form is known.
func (t *Tagger[K]) Key(text string) (K, error) {
	f := t.Form()
	if f == nil {
		var err error
		if f, err = t.readForm(); err != nil {
			return *new(K), err
		}
	}
	s, err := f.Key(text)
	if err != nil {
		return *new(K), err
	}
	return t.parse(s)
}

// readForm reads the key column's form for Key, once at a time: a Key
// that finds another one reading returns ErrKeyUnknown rather than wait.
func (t *Tagger[K]) readForm() (KeyForm, error) {
	if t.col == nil {
		return nil, fmt.Errorf("%w: the Tagger has no column (Tagger.UseColumn)", ErrKeyUnknown)
	}
	if !t.readMu.TryLock() {
		return nil, fmt.Errorf("%w: it is being read", ErrKeyUnknown)
	}
	defer t.readMu.Unlock()
	if f := t.Form(); f != nil {
		return f, nil
	}
	f, err := t.col.Read()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyUnknown, err)
	}
	t.form.CompareAndSwap(nil, &formBox{f})
	return t.Form(), nil
}

// KeyRule returns the key rule a follower installs in its Loader
// ([guarded.Feed.SetKeyRule]), so that every entry of the Loader, and the
// middleware and rpcguard through it, takes a key in any text the
// database reads as it, as [Tagger.Key] does: the key's text, its
// canonical form, and parse of that. It is nil for keys of one column
// whose type is not a string kind (an integer, a [16]byte uuid: one form
// per value already). Until the column's form is known (a follower reads
// it at its first session, before its Loader is ready) it returns keys as
// they are. It reads nothing from the database.
func (t *Tagger[K]) KeyRule() func(K) (K, error) {
	if reflect.TypeFor[K]().Kind() != reflect.String && (t.col == nil || !t.col.Composite()) {
		return nil
	}
	return func(k K) (K, error) {
		f := t.Form()
		if f == nil || f.Trivial() {
			return k, nil
		}
		s, err := f.Key(t.text(k))
		if err != nil {
			return k, err
		}
		return t.parse(s)
	}
}
