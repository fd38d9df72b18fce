// Package options applies functional options and refuses nil ones, for
// every package of the module and its nested modules.
package options

import "fmt"

// Apply calls each option of opts on c, in order. It returns an error
// that names caller (such as "guard: New") and the position of the first
// nil option, before it calls any: a nil Option is a mistake, often a
// conditional option left unset, and must not panic.
func Apply[C any, O ~func(*C)](caller string, c *C, opts []O) error {
	for i, o := range opts {
		if o == nil {
			return fmt.Errorf("%s: option %d of %d is nil", caller, i+1, len(opts))
		}
	}
	for _, o := range opts {
		o(c)
	}
	return nil
}
