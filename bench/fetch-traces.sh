#!/bin/sh
# Fetches the public request traces the report replays from where their authors published
# them, and checks each against its pinned SHA-256: `make traces` (DIR defaults to ./traces;
# the report reads it with --traces DIR or KVROUTERD_TRACES=DIR).
#
# Mooncake FAST'25 traces (kvcache-ai/Mooncake, FAST25-release/traces/), Apache-2.0.
set -eu
dir=${1:-traces}
base=https://raw.githubusercontent.com/kvcache-ai/Mooncake
mkdir -p "$dir/mooncake"
fetch() { # url file
	if command -v curl >/dev/null 2>&1; then
		curl -fsSL --retry 3 -o "$2.part" "$1"
	elif command -v wget >/dev/null 2>&1; then
		wget -q -O "$2.part" "$1"
	else
		echo "fetch-traces: neither curl nor wget is installed" >&2
		return 1
	fi
}
sha() {
	if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}
status=0
while read -r commit file sum; do
	out="$dir/mooncake/$file"
	if [ -f "$out" ] && [ "$(sha "$out")" = "$sum" ]; then
		echo "fetch-traces: $out is there"
		continue
	fi
	url="$base/$commit/FAST25-release/traces/$file"
	if ! fetch "$url" "$out"; then
		echo "fetch-traces: could not fetch $url (no network?). Download it by hand into $dir/mooncake/, or point --traces at a copy." >&2
		rm -f "$out.part"
		status=1
		continue
	fi
	if [ "$(sha "$out.part")" != "$sum" ]; then
		echo "fetch-traces: $url has SHA-256 $(sha "$out.part"), want $sum: not the trace the report's numbers are of; left aside as $out.part" >&2
		status=1
		continue
	fi
	mv "$out.part" "$out"
	echo "fetch-traces: $out"
done <<'LIST'
a2a4b18ac537fd798d50e6e9f57031ce86419a37 conversation_trace.jsonl b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df
3cca71daccf2a7afb8fe3f0295358f70e3a69fdb synthetic_trace.jsonl bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131
LIST
exit $status
