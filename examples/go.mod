module github.com/cuckooguard/cuckooguard/examples

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/cuckooguard/cuckooguard v0.0.0-00010101000000-000000000000
	github.com/cuckooguard/cuckooguard/metrics v0.0.0-00010101000000-000000000000
	github.com/cuckooguard/cuckooguard/postgres v0.0.0-00010101000000-000000000000
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.13.0
	github.com/nats-io/nats.go v1.55.0
	github.com/prometheus/client_golang v1.25.0
	go.uber.org/goleak v1.3.0
	google.golang.org/grpc v1.85.0
	modernc.org/sqlite v1.61.1
)

require (
	github.com/klauspost/compress v1.20.1 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cuckooguard/cuckooguard/fanout v0.0.0-00010101000000-000000000000
	github.com/cuckooguard/cuckooguard/pgguard v0.0.0-00010101000000-000000000000
	github.com/cuckooguard/cuckooguard/rpcguard v0.0.0-00010101000000-000000000000
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/zeebo/xxh3 v1.1.0 // indirect
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.12
	modernc.org/libc v1.79.0 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
)

replace github.com/cuckooguard/cuckooguard => ../

replace github.com/cuckooguard/cuckooguard/postgres => ../postgres

replace github.com/cuckooguard/cuckooguard/metrics => ../metrics

replace github.com/cuckooguard/cuckooguard/fanout => ../fanout

replace github.com/cuckooguard/cuckooguard/rpcguard => ../rpcguard

replace github.com/cuckooguard/cuckooguard/pgguard => ../pgguard
