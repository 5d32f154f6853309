#!/usr/bin/env bash
# make release: static, version-stamped binaries of ferry and ferry-bench
# for each platform in PLATFORMS, with SHA-256 sums, under OUT.
#
#   VERSION   default: git describe --tags --always --dirty
#   PLATFORMS default: "linux/amd64 linux/arm64"
#   OUT       default: dist
set -euo pipefail
cd "$(dirname "$0")/.."
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then commit="$commit+changes"; fi
platforms=${PLATFORMS:-linux/amd64 linux/arm64}
out=${OUT:-dist}
mkdir -p "$out"
for p in $platforms; do
  os=${p%/*} arch=${p#*/}
  dir="$out/ferry-$version-$os-$arch"
  mkdir -p "$dir"
  echo "== $version $os/$arch -> $dir"
  for cmd in ferry ferry-bench; do
    # CGO off: a static binary that runs on any Linux of that architecture.
    CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath \
      -ldflags "-s -w -X github.com/ferryhq/ferry/pipeline.Version=$version -X main.buildCommit=$commit" \
      -o "$dir/$cmd" "./cmd/$cmd"
  done
  cp packaging/ferry.service README.md "$dir/"
  tar -C "$out" -czf "$dir.tar.gz" "$(basename "$dir")"
done
(cd "$out" && sha256sum ./*.tar.gz >SHA256SUMS)
echo "== $out/SHA256SUMS"
cat "$out/SHA256SUMS"
