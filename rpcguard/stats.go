package rpcguard

// Stats counts what an Interceptor did. The counters are read one by one
// and do not necessarily form a consistent snapshot.
type Stats struct {
	// Methods has the counters of every guarded method, by its full
	// name: the methods of the Keys given to New, whether or not a
	// request came.
	Methods map[string]MethodStats
	// Unfiltered counts the requests of methods that are not guarded:
	// passed unchanged.
	Unfiltered uint64
	// Tokens counts the requests of guarded methods that carried a
	// consistency token (TokenMetadata); TokensRefused those whose token
	// did not read (they, and their handler's lookups, passed through);
	// TokensSet the responses of writes that got one.
	Tokens, TokensRefused, TokensSet uint64
}

// MethodStats counts the requests of one guarded method, as
// middleware.Stats counts an HTTP route's: every request counts once in
// one of Rejected, Passed and MissingKey.
type MethodStats struct {
	Rejected       uint64 // answered NotFound without the handler: the guard knew the key was absent
	Passed         uint64 // the key may exist (or the Loader was not ready): passed to the handler
	MissingKey     uint64 // no well-formed key (or no first message on a stream): passed to the handler
	FalsePositives uint64 // passed, and the handler answered NotFound: observed false positives
}

// Stats returns the Interceptor's counters.
func (ic *Interceptor[K]) Stats() Stats {
	st := Stats{Methods: make(map[string]MethodStats, len(ic.methods)), Unfiltered: uint64(ic.unfiltered.Value()),
		Tokens: uint64(ic.tokens.Value()), TokensRefused: uint64(ic.tokenRefused.Value()), TokensSet: uint64(ic.tokensSet.Value())}
	for name, m := range ic.methods {
		st.Methods[name] = MethodStats{
			Rejected:       uint64(m.rejected.Value()),
			Passed:         uint64(m.passed.Value()),
			MissingKey:     uint64(m.missingKey.Value()),
			FalsePositives: uint64(m.falsePos.Value()),
		}
	}
	return st
}
