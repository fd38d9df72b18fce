module github.com/cuckooguard/cuckooguard/bench

go 1.26.0

require (
	github.com/bits-and-blooms/bloom/v3 v3.7.1
	github.com/cuckooguard/cuckooguard v0.0.0
	github.com/linvon/cuckoo-filter v0.4.0
	github.com/panmari/cuckoofilter v1.0.6
	github.com/seiflotfy/cuckoofilter v0.0.0-20240715131351-a2f2c23f1771
)

require (
	github.com/bits-and-blooms/bitset v1.24.2 // indirect
	github.com/dgryski/go-metro v0.0.0-20200812162917-85c65e2d0165 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
)

replace github.com/cuckooguard/cuckooguard => ../
