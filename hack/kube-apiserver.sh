#!/usr/bin/env bash
# Build k8s.io/kubernetes/cmd/kube-apiserver from the Go module proxy and cache the
# binary under .cache/ (git-ignored). Used by the controllers/ integration tests.
#
# Idempotent: does nothing when the cached binary already exists.
# Prints the path of the binary on stdout.
#
#   hack/kube-apiserver.sh            # build (about 5-10 minutes on 2 cores) or reuse
#   KUBE_VERSION=v1.34.4 hack/kube-apiserver.sh
#
# kubernetes' own go.mod replaces every k8s.io staging module with a path inside
# its repository (./staging/src/k8s.io/...), which a module consumer cannot use.
# We build in a throwaway module that requires k8s.io/kubernetes and replaces
# each staging module with its published v0.Y.Z tag instead.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${KUBE_APISERVER_OUT:-$root/.cache/kube-apiserver-$KUBE_VERSION}"

if [[ -x "$out" ]]; then
	echo "$out"
	exit 0
fi

case "$KUBE_VERSION" in
v1.*.*) ;;
*)
	echo "KUBE_VERSION must look like v1.Y.Z, got '$KUBE_VERSION'" >&2
	exit 2
	;;
esac
staging_version="v0.${KUBE_VERSION#v1.}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local

# Fetch kubernetes' go.mod to learn the staging module list of this version.
gomod="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
if [[ -z "$gomod" || ! -f "$gomod" ]]; then
	echo "could not download the go.mod of k8s.io/kubernetes@$KUBE_VERSION" >&2
	exit 1
fi
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*#\1#p' "$gomod")
if [[ ${#staging[@]} -eq 0 ]]; then
	echo "no staging replace directives found in $gomod" >&2
	exit 1
fi

goversion="$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod")"
{
	echo "module kubeapiserverbuild"
	echo
	echo "go ${goversion:-1.24}"
	echo
	echo "require k8s.io/kubernetes $KUBE_VERSION"
	echo
	echo "replace ("
	for m in "${staging[@]}"; do
		echo "	$m => $m $staging_version"
	done
	echo ")"
} >go.mod
cat >tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO

echo "building kube-apiserver $KUBE_VERSION (${#staging[@]} staging modules at $staging_version)" >&2
start=$SECONDS
go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" >&2
mkdir -p "$(dirname "$out")"
go build -trimpath -ldflags "-s -w" -o "$out.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$out.tmp" "$out"
echo "built $out in $((SECONDS - start))s" >&2
echo "$out"
