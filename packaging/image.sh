#!/bin/sh
# Build vipd's container image into dist/ (or $DIST) as an OCI archive, with
# no Docker daemon: dist/vipd-image-<tag>.oci.tar.
#
#   packaging/image.sh [GIT_DESCRIBE]
#
# The version is the package version (packaging/build.sh --print-version);
# the image is tagged $IMAGE_REPO:<tag> and $IMAGE_REPO:latest, where <tag> is
# the version with every character a tag may not hold ('+', '~') turned into
# '-': the tag `vipd manifest static-pod` names by default (see
# manifest.ImageTag). Reproducible: SOURCE_DATE_EPOCH defaults to the
# commit's time, binaries are built with -trimpath and no VCS stamp, and the
# image is assembled by packaging/tools/image (go-containerregistry, pinned in
# packaging/tools/go.mod).
#
# Load it: ctr -n k8s.io images import dist/vipd-image-<tag>.oci.tar
#          podman load -i dist/vipd-image-<tag>.oci.tar
# Environment: ARCH (GOARCH), DIST, GO, IMAGE_REPO (default ghcr.io/vipd/vipd).
set -eu

cd "$(dirname "$0")/.."
GO=${GO:-go}
ARCH=${ARCH:-$($GO env GOARCH)}
DIST=${DIST:-dist}
IMAGE_REPO=${IMAGE_REPO:-ghcr.io/vipd/vipd}
describe=${1:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
VERSION=$(packaging/build.sh --print-version "$describe")
TAG=$(printf '%s' "$VERSION" | tr -c 'A-Za-z0-9_.-' '-')
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH

BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
mkdir -p "$DIST"
ldflags="-s -w -X main.version=$VERSION -X main.commit=$COMMIT"
# vipd's runtime defaults: packaging/build.sh --print-godebug.
godebug=$(packaging/build.sh --print-godebug)
for cmd in vipd vipd-controllers; do
	flags=$ldflags
	[ "$cmd" = vipd ] && flags="$flags -X runtime.godebugDefault=$godebug"
	CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH $GO build -trimpath -buildvcs=false -ldflags "$flags" -o "$BUILD/$cmd" ./cmd/$cmd
done
out=$DIST/vipd-image-$TAG.oci.tar
# The tools module resolves its own dependencies; give it absolute paths.
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
$GO -C packaging/tools run ./image -vipd "$BUILD/vipd" -controllers "$BUILD/vipd-controllers" \
	-version "$VERSION" -commit "$COMMIT" -arch "$ARCH" \
	-tag "$IMAGE_REPO:$TAG,$IMAGE_REPO:latest" -out "$(abs "$out")"
