package guarded

import "fmt"

// keyRule is the store's rule for the text of its keys: the one form, of
// the many texts a caller may give, in which the guard holds a key (a
// citext column's keys in lower case, a uuid's in lower case with
// hyphens). A change feed installs it ([Feed.SetKeyRule]); every entry of
// the Loader applies it, so that a caller who passes a key as a user
// typed it gets the answer the store would give.
type keyRule[K comparable] struct {
	canon func(K) (K, error)
}

// canon returns key in the form of the Loader's key rule, and whether the
// rule could judge it: a key it cannot judge (a text it does not read,
// such as a timestamp without an offset) is looked up in the store as it
// is, never answered absent by the guard.
func (l *Loader[K, V]) canon(key K) (K, bool) {
	r := l.rule.Load()
	if r == nil {
		return key, true
	}
	k, err := r.canon(key)
	if err != nil {
		return key, false
	}
	return k, true
}

// canonWrite is canon for a write, which needs a key in the rule's form:
// one the rule cannot judge is an error, and nothing is written.
func (l *Loader[K, V]) canonWrite(op string, key K) (K, error) {
	r := l.rule.Load()
	if r == nil {
		return key, nil
	}
	k, err := r.canon(key)
	if err != nil {
		return key, fmt.Errorf("guarded: %s: the key %v is in no form the store's key rule reads, so the guard could not hold it: %w", op, key, err)
	}
	return k, nil
}
