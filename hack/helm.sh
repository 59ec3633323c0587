#!/usr/bin/env bash
# Build the helm CLI (helm.sh/helm/v3/cmd/helm) from the Go module proxy and
# cache the binary under .cache/ (git-ignored). Used by test/helm and
# `make helm`. helm's packages are not imported into vipd's go.mod: their
# dependency tree would slow every build of vipd.
#
# Idempotent: does nothing when the cached binary already exists.
# Prints the path of the binary on stdout.
#
#   hack/helm.sh                      # build (a few minutes on 2 cores) or reuse
#   HELM_VERSION=v3.19.5 hack/helm.sh
#
# v3.19.x is the helm line built on k8s.io v0.34, the version vipd and the
# test kube-apiserver use.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.5}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${HELM_OUT:-$root/.cache/helm-$HELM_VERSION}"

if [[ -x "$out" ]]; then
	echo "$out"
	exit 0
fi

case "$HELM_VERSION" in
v3.*.*) ;;
*)
	echo "HELM_VERSION must look like v3.Y.Z, got '$HELM_VERSION'" >&2
	exit 2
	;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local

cat >go.mod <<MOD
module helmbuild

go 1.24
MOD
cat >tools.go <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO

echo "building helm $HELM_VERSION" >&2
start=$SECONDS
go get "helm.sh/helm/v3@$HELM_VERSION" >&2
# As helm's Makefile does: the Kubernetes version helm assumes without a
# cluster (helm template, helm lint) is the one of its client-go (v0.34.x:
# 1.34), not the built-in 1.20 fallback.
k8s="$(go list -f '{{.Version}}' -m k8s.io/client-go)"
k8s_minor="$(echo "$k8s" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
	ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
done
mkdir -p "$(dirname "$out")"
go build -trimpath -ldflags "$ldflags" -o "$out.tmp" helm.sh/helm/v3/cmd/helm
mv "$out.tmp" "$out"
echo "built $out in $((SECONDS - start))s" >&2
echo "$out"
