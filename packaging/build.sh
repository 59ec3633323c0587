#!/bin/sh
# Build the vipd deb and rpm into dist/ (or $DIST).
#
#   packaging/build.sh [GIT_DESCRIBE]
#   packaging/build.sh --print-version GIT_DESCRIBE
#   packaging/build.sh --print-godebug
#
# GIT_DESCRIBE defaults to `git describe --tags --always --dirty`; it is
# turned into a version deb and rpm both order correctly:
#   v1.2.3                 -> 1.2.3
#   v1.2.3-4-gabc1234      -> 1.2.3+git4.abc1234
#   v1.3.0-rc1             -> 1.3.0~rc1
#   abc1234 (no tag yet)   -> 0.0.0~git<commits>.abc1234
#   ...-dirty              -> ....dirty
# Environment: ARCH (GOARCH, default the host's), DIST (output directory),
# GO (go command). nfpm is the version pinned in packaging/tools/go.mod.
set -eu

cd "$(dirname "$0")/.."
GO=${GO:-go}
ARCH=${ARCH:-$($GO env GOARCH)}
DIST=${DIST:-dist}
describe=${1:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}

version_of() {
	d=$1
	dirty=""
	case "$d" in *-dirty) dirty=".dirty"; d=${d%-dirty} ;; esac
	# Commits since the tag: <tag>-N-g<sha>.
	since=""
	if printf '%s' "$d" | grep -Eq -- '-[0-9]+-g[0-9a-f]+$'; then
		sha=${d##*-g}
		d=${d%-g*}
		n=${d##*-}
		d=${d%-*}
		since="+git${n}.${sha}"
	fi
	# No tag yet: just an abbreviated commit (checked first: a hash may be all digits).
	if [ -z "$since" ] && printf '%s' "$d" | grep -Eq '^[0-9a-f]{7,40}$'; then
		n=$(git rev-list --count HEAD 2>/dev/null || echo 0)
		echo "0.0.0~git${n}.${d}${dirty}"
		return
	fi
	# A release tag v1.2.3, or a pre-release v1.2.3-rc1 (sorts before 1.2.3).
	if printf '%s' "$d" | grep -Eq '^v?[0-9]+(\.[0-9]+)*(-[A-Za-z][A-Za-z0-9.]*)?$'; then
		d=${d#v}
		echo "$d${since}${dirty}" | sed 's/-/~/'
		return
	fi
	echo "0.0.0~${d}${since}${dirty}" | tr -c 'A-Za-z0-9.+~\n' '.'
}

# vipd's runtime defaults, linked in as runtime.godebugDefault (a GODEBUG
# in vipd's environment overrides each): gcshrinkstackoff=1, the stacks of
# its goroutines are not shrunk by the garbage collector (cmd/vipd/lean.go
# says why). The -X replaces the defaults go build links in for the module
# (go.mod's go and godebug lines), so they come first.
godebug_of_vipd() {
	d=$($GO list -f '{{.DefaultGODEBUG}}' ./cmd/vipd)
	echo "${d:+$d,}gcshrinkstackoff=1"
}

if [ "${1:-}" = "--print-godebug" ]; then
	# For the Makefile and packaging/image.sh.
	godebug_of_vipd
	exit 0
fi

if [ "${1:-}" = "--print-version" ]; then
	# For tests: packaging/build.sh --print-version GIT_DESCRIBE
	version_of "${2:?--print-version needs a git describe string}"
	exit 0
fi

VERSION=$(version_of "$describe")
case "$VERSION" in [0-9]*) ;; *) echo "build.sh: bad version $VERSION from $describe" >&2; exit 1 ;; esac

BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
mkdir -p "$BUILD/completion" "$BUILD/doc" "$DIST"

# Reproducible timestamps (nfpm and gzip honour them).
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH
date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)

COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "build.sh: vipd $VERSION for linux/$ARCH"
CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH $GO build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT -X runtime.godebugDefault=$(godebug_of_vipd)" -o "$BUILD/vipd" ./cmd/vipd
# The optional Kubernetes controllers: a separate binary vipd starts when
# VIPD_CONTROLLERS is set (it looks in /usr/lib/vipd/).
CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH $GO build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" -o "$BUILD/vipd-controllers" ./cmd/vipd-controllers

# Completions come from the binary's cobra commands: use a host build when
# cross-building.
gen="$BUILD/vipd"
if [ "$ARCH" != "$($GO env GOHOSTARCH)" ]; then
	gen="$BUILD/vipd-host"
	CGO_ENABLED=0 $GO build -o "$gen" ./cmd/vipd
fi
"$gen" completion bash >"$BUILD/completion/vipd.bash"
"$gen" completion zsh >"$BUILD/completion/_vipd"
$GO run ./packaging/genman -version "$VERSION" -date "$date" | gzip -9n >"$BUILD/vipd.8.gz"
for d in install kubeadm migration; do
	[ -f "docs/$d.md" ] && cp "docs/$d.md" "$BUILD/doc/"
done

cp packaging/vipd.service packaging/vipd-cleanup.service packaging/vipd.env packaging/copyright LICENSE CHANGELOG.yml "$BUILD/"
# Every file gets the commit's time, so the packages are reproducible.
find "$BUILD" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

# nfpm expands ${VAR} in version and arch but not in content paths.
sed "s|\${VIPD_BUILD}|$BUILD|g" nfpm.yaml >"$BUILD/nfpm.yaml"
for p in deb rpm; do
	VIPD_VERSION=$VERSION VIPD_ARCH=$ARCH \
		$GO tool -modfile=packaging/tools/go.mod nfpm package --config "$BUILD/nfpm.yaml" --packager $p --target "$DIST/"
done
ls -l "$DIST"/vipd*"$VERSION"* 2>/dev/null || ls -l "$DIST"
