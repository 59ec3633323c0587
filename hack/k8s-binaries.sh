#!/usr/bin/env bash
# Build the Kubernetes binaries the tests run, kube-apiserver
# (k8s.io/kubernetes/cmd/kube-apiserver, test/kube, kube/, ipam/, ...) and the
# helm CLI (helm.sh/helm/v3/cmd/helm, test/helm, make release-artifacts), from
# the Go module proxy, and cache them under .cache/ (git-ignored).
#
#   hack/k8s-binaries.sh                  # both (about 8 minutes of CPU cold)
#   hack/k8s-binaries.sh kube-apiserver   # only kube-apiserver
#   hack/k8s-binaries.sh helm             # only helm
#   KUBE_VERSION=v1.34.4 HELM_VERSION=v3.19.5 hack/k8s-binaries.sh
#
# Idempotent: a binary already cached is not built again. Prints the path of
# each binary asked for on stdout, one a line, in the order asked.
# KUBE_APISERVER_OUT and HELM_OUT override where the binaries go.
#
# Both are built in ONE throwaway module with ONE `go build`: the k8s.io
# packages they share (apimachinery, client-go, apiserver, ...) compile once,
# and the two links overlap with the compiles of the other binary.
#
# kubernetes' own go.mod replaces every k8s.io staging module with a path
# inside its repository (./staging/src/k8s.io/...), which a module consumer
# cannot use: the throwaway module replaces each staging module with its
# published v0.Y.Z tag instead. helm's k8s.io modules (v3.19.x is the line on
# k8s.io v0.34) go through the same replaces, so helm is built on the very
# k8s.io release vipd and the test kube-apiserver use, whether it is built
# alone or with kube-apiserver.
#
# helm's packages are not imported into vipd's go.mod: their dependency tree
# would slow every build of vipd.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.34.4}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kube_out="${KUBE_APISERVER_OUT:-$root/.cache/kube-apiserver-$KUBE_VERSION}"
helm_out="${HELM_OUT:-$root/.cache/helm-$HELM_VERSION}"

case "$KUBE_VERSION" in
v1.*.*) ;;
*)
	echo "KUBE_VERSION must look like v1.Y.Z, got '$KUBE_VERSION'" >&2
	exit 2
	;;
esac
case "$HELM_VERSION" in
v3.*.*) ;;
*)
	echo "HELM_VERSION must look like v3.Y.Z, got '$HELM_VERSION'" >&2
	exit 2
	;;
esac

# What was asked for, and what of it is missing.
(($# > 0)) || set -- kube-apiserver helm
outs=() pkgs=() names=()
for b in "$@"; do
	case "$b" in
	kube-apiserver) out="$kube_out" pkg=k8s.io/kubernetes/cmd/kube-apiserver ;;
	helm) out="$helm_out" pkg=helm.sh/helm/v3/cmd/helm ;;
	*)
		echo "usage: hack/k8s-binaries.sh [kube-apiserver] [helm]: unknown binary '$b'" >&2
		exit 2
		;;
	esac
	outs+=("$out")
	if [[ ! -x "$out" && " ${names[*]} " != *" $b "* ]]; then
		names+=("$b")
		pkgs+=("$pkg")
	fi
done
if ((${#names[@]} == 0)); then
	printf '%s\n' "${outs[@]}"
	exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local

# Fetch kubernetes' go.mod to learn the staging module list of this version.
staging_version="v0.${KUBE_VERSION#v1.}"
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

# helm goes through the same replaces: its k8s.io line must be this one.
if [[ " ${names[*]} " == *" helm "* ]]; then
	helmmod="$(go list -m -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
	helm_k8s="$(sed -n 's#^[[:space:]]*k8s\.io/client-go \(v[0-9.]*\).*#\1#p' "$helmmod" 2>/dev/null)"
	if [[ "${helm_k8s%.*}" != "${staging_version%.*}" ]]; then
		echo "HELM_VERSION=$HELM_VERSION is built on k8s.io/client-go ${helm_k8s:-(unknown)}, KUBE_VERSION=$KUBE_VERSION on ${staging_version%.*}.x: pick a helm release of the same k8s.io line (v3.19.x for v1.34)" >&2
		exit 2
	fi
fi

goversion="$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod")"
{
	echo "module k8sbinaries"
	echo
	echo "go ${goversion:-1.24}"
	echo
	echo "replace ("
	for m in "${staging[@]}"; do
		echo "	$m => $m $staging_version"
	done
	echo ")"
} >go.mod
{
	echo "//go:build tools"
	echo
	echo "package tools"
	echo
	for p in "${pkgs[@]}"; do
		echo "import _ \"$p\""
	done
} >tools.go

echo "building ${names[*]} (kube-apiserver $KUBE_VERSION, helm $HELM_VERSION; ${#staging[@]} staging modules at $staging_version)" >&2
start=$SECONDS
gets=()
for b in "${names[@]}"; do
	case "$b" in
	kube-apiserver) gets+=("k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION") ;;
	helm) gets+=("helm.sh/helm/v3/cmd/helm@$HELM_VERSION") ;;
	esac
done
go get "${gets[@]}" >&2

ldflags="-s -w"
if [[ " ${names[*]} " == *" helm "* ]]; then
	# As helm's Makefile does: the Kubernetes version helm assumes without a
	# cluster (helm template, helm lint) is the one of its client-go (1.34
	# for v0.34.x), not the built-in 1.20 fallback. The -X of helm's packages
	# are ignored by the kube-apiserver link, which has none of them.
	k8s="$(go list -f '{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}' -m k8s.io/client-go)"
	k8s_minor="$(echo "$k8s" | cut -d. -f2)"
	ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
	done
fi
mkdir -p bin
go build -trimpath -ldflags "$ldflags" -o bin/ "${pkgs[@]}"
for b in "${names[@]}"; do
	case "$b" in
	kube-apiserver) out="$kube_out" ;;
	helm) out="$helm_out" ;;
	esac
	mkdir -p "$(dirname "$out")"
	mv "bin/$b" "$out.tmp"
	mv "$out.tmp" "$out"
done
echo "built ${names[*]} in $((SECONDS - start))s" >&2
printf '%s\n' "${outs[@]}"
