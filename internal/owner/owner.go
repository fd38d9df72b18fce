// Package owner lets a wrapper mark a guard as its own, once, without
// package guard exporting the mark: a guard has at most one Loader, which
// closes it. Package guard sets Claim in its init; package guarded calls
// it.
package owner

// Claim marks g, a *guard.Guard, as owned and reports whether nobody had
// claimed it before. The mark is a field of the guard, so it lives and
// dies with it. Claim is set by package guard, which every caller of
// Claim imports.
var Claim func(g any) bool
