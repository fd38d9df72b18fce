module github.com/cuckooguard/cuckooguard

go 1.26.0

require (
	github.com/puzpuzpuz/xsync/v3 v3.5.1
	github.com/zeebo/xxh3 v1.1.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.30.0
)

require github.com/klauspost/cpuid/v2 v2.2.10 // indirect
