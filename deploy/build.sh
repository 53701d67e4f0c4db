#!/bin/sh
# Builds the kvrouterd binary the container image ships: static (no cgo, so it runs on an image
# with no C library), without the build machine's paths (-trimpath), stripped, with the version
# stamped in. The Dockerfile runs this script and the deploy package's tests run it too, so the
# image's build is the one the test suite checks.
#
# Usage: deploy/build.sh OUT   (VERSION, GO, GOOS and GOARCH from the environment; VERSION dev
# unless set)
set -eu
out=${1:?usage: deploy/build.sh OUT}
cd "$(dirname "$0")/.."
CGO_ENABLED=0 exec "${GO:-go}" build -trimpath -buildvcs=false \
	-ldflags "-s -w -X main.version=${VERSION:-dev}" \
	-o "$out" ./cmd/kvrouterd
