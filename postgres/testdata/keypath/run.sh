#!/bin/sh
# Alternates the old (fc1f52d) and new test binaries of BenchmarkKeyPath
# (postgres) and BenchmarkLoaderGet (guarded), built with go test -c as
# pg_old.test, pg_new.test, guarded_old.test, guarded_new.test beside this
# script; results to $OUT, for benchstat.
set -e
cd "$(dirname "$0")"
for i in $(seq ${ROUNDS:-12}); do
	for v in old new; do
		./pg_$v.test -test.run '^$' -test.bench BenchmarkKeyPath -test.benchtime ${BT:-0.2s} -test.cpu 1 >> "$OUT/keypath_$v.txt"
		./guarded_$v.test -test.run '^$' -test.bench BenchmarkLoaderGet -test.benchtime ${BT:-0.2s} -test.cpu 1 >> "$OUT/loaderget_$v.txt"
	done
done
