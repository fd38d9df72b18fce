#!/usr/bin/env bash
# Runs the comparison benchmarks against a committed snapshot of the
# repository, so that the output names the code it measured even while the
# work tree is being edited.
#
#   bench/run.sh [COMMIT] [go test flags...] | tee out.txt
#
# COMMIT defaults to HEAD; the flags default to -count=5 -cpu=1,2. The
# snapshot is `git archive COMMIT`, used through a copy of bench/go.mod
# whose replace points at it (go test -modfile); nothing in the repository
# is written.
set -euo pipefail
cd "$(dirname "$0")"
rev=$(git rev-parse --verify "${1:-HEAD}^{commit}")
shift || true
[ $# -gt 0 ] || set -- -count=5 -cpu=1,2
top=$(git rev-parse --show-toplevel)
snap=$(mktemp -d)
trap 'rm -rf "$snap"' EXIT
mkdir "$snap/src"
git -C "$top" archive "$rev" | tar -x -C "$snap/src"
sed "s#=> \.\./#=> $snap/src#" go.mod >"$snap/bench.mod"
cp go.sum "$snap/bench.sum"
go mod tidy -modfile="$snap/bench.mod" >&2

echo "# $(go version)"
echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') ($(nproc) cores)"
echo "# commit: $rev ($(git log -1 --format=%s "$rev"))"
echo "# date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# command: cd bench && go test -run='^\$' -bench=. -benchmem ./compare/ $* -timeout=90m"
echo
go test -modfile="$snap/bench.mod" -run='^$' -bench=. -benchmem "$@" -timeout=90m ./compare/
