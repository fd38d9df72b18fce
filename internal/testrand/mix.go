package testrand

// Mix is the SplitMix64 finalizer, a bijection of uint64 that spreads
// nearby inputs over the whole range: distinct keys and hashes for tests
// and benchmarks.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
