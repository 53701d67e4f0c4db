#!/bin/sh
# Hot-path microbenchmarks of a base revision and of the working tree, the two test binaries
# run alternately round by round, so that the drift of a shared machine falls on both alike;
# benchstat then compares them. Usage: bench/micro-ab.sh REV [ROUNDS] (make micro-ab BASE=REV).
set -eu
base=${1:?usage: bench/micro-ab.sh REV [ROUNDS]}
rounds=${2:-6}
benchstat=${BENCHSTAT:-golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da}
out=bench/out/ab
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" 2>/dev/null; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/base" "$base"
for p in radix shard router server; do
	(cd "$tmp/base" && go test -c -o "$tmp/old-$p.test" "./$p/")
	go test -c -o "$tmp/new-$p.test" "./$p/"
done
: >"$out/old.txt"
: >"$out/new.txt"
run() { # run VERSION PACKAGE BENCH
	(cd "$2" && "$tmp/$1-$2.test" -test.run '^$' -test.bench "$3" -test.benchmem) | grep '^Benchmark' >>"$out/$1.txt"
}
for i in $(seq "$rounds"); do
	for v in old new; do
		run $v radix 'IndexMatch/residencies=1e\+0[67]|HashBlocks'
		run $v shard 'ApplierApply|ShardApply/shards=2|MatchUnderLoad'
		run $v router '^BenchmarkRoute$|^BenchmarkRouteCold$'
		# A base older than this benchmark has none to run.
		run $v server 'HandleRouteParallel' || [ $v = old ]
	done
	echo "round $i of $rounds" >&2
done
go run "$benchstat" "$out/old.txt" "$out/new.txt" | tee "$out/ab.txt"
