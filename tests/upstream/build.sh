#!/usr/bin/env bash
# Builds the real Kubernetes control plane the real-server tests run against (issue 16), from
# upstream's published Go modules at the versions pinned in this folder:
#
#   kube-apiserver, kube-controller-manager   k8s.io/kubernetes (go.mod, the `tool` lines)
#   kubelet, kube-scheduler, kubemark         the same module, for the one-node cluster
#                                             (tests/cluster/cluster.sh, issue 33)
#   every main under cmd/*                    our own small Go programs over upstream packages
#   etcd                                      go.etcd.io/etcd/server/v3 (etcd/go.mod, etcd/main.go)
#   helm                                      helm.sh/helm/v3 (helm/go.mod, its `tool` line), for
#                                             the chart checks (charts/nodeipam, issue 21)
#
# into a cache folder keyed by the pinned versions and a hash of everything that goes into the
# build (go.mod, go.sum, our mains, this script), reused when present:
#
#   ${NODEIPAM_UPSTREAM_CACHE:-$HOME/.cache/nodeipam-upstream}/k8s-<version>_etcd-<version>_helm-<version>_<hash>
#
# A new folder (a changed pin, main or this script) is a new `go build` of everything, but Go's
# build cache still holds every package whose inputs did not change, so only what changed is
# compiled again; the rest is linking.
#
# Prints that folder as its LAST line on stdout (everything else goes to stderr), so
#   export NODEIPAM_UPSTREAM_BIN="$(tests/upstream/build.sh | tail -n 1)"
# is all a caller needs. Needs Go (the `go` on PATH, else /usr/local/go/bin/go) at least as new as
# go.mod's `go` line, and the Go module proxy (GOPROXY) for a cold module cache. The modules are
# verified against go.sum (-mod=readonly: a go.sum that does not cover the build fails instead of
# being rewritten). Binaries are static (CGO_ENABLED=0), built with -trimpath and -ldflags='-s -w'.
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "build.sh: $*" >&2; }

GO="$(command -v go || true)"
if [[ -z "$GO" && -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
fi
if [[ -z "$GO" ]]; then
    log "no Go toolchain: install Go (see go.mod's go line) or put it on PATH"
    exit 1
fi

# The pinned versions, read from the go.mod files (one place to change them).
# `require M v` or a line `M v` inside a require block.
pinned() { awk -v m="$1" '$1 == "require" { $0 = substr($0, 9) } $1 == m && $2 ~ /^v/ { print $2; exit }' "$2"; }
K8S_VERSION="$(pinned k8s.io/kubernetes "$HERE/go.mod")"
ETCD_VERSION="$(pinned go.etcd.io/etcd/server/v3 "$HERE/etcd/go.mod")"
HELM_VERSION="$(pinned helm.sh/helm/v3 "$HERE/helm/go.mod")"
if [[ -z "$K8S_VERSION" || -z "$ETCD_VERSION" || -z "$HELM_VERSION" ]]; then
    log "cannot read the pinned versions from $HERE/go.mod, $HERE/etcd/go.mod and $HERE/helm/go.mod"
    exit 1
fi

# Everything that decides the binaries: a changed main or go.sum gives a new folder.
INPUTS="$(cd "$HERE" && find . -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name build.sh |
    LC_ALL=C sort)"
# shellcheck disable=SC2086 # one path per line, no spaces in our file names
HASH="$(cd "$HERE" && { echo "$INPUTS"; cat $INPUTS; "$GO" env GOVERSION GOOS GOARCH; } |
    sha256sum | cut -c1-12)"
CACHE_ROOT="${NODEIPAM_UPSTREAM_CACHE:-$HOME/.cache/nodeipam-upstream}"
OUT="$CACHE_ROOT/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_$HASH"

if [[ -f "$OUT/.complete" ]]; then
    log "reusing $OUT (built $(cat "$OUT/.complete"))"
    echo "$OUT"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
log "building kube-apiserver, kube-controller-manager, kubelet, kube-scheduler, kubemark ($K8S_VERSION), etcd ($ETCD_VERSION), helm ($HELM_VERSION) and cmd/* with $("$GO" version) into $OUT"

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
# The version the binaries report (/version, --version), as upstream's release build stamps it.
K8S_MINOR="$(cut -d. -f2 <<<"$K8S_VERSION")"
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
LDFLAGS+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$K8S_MINOR"
LDFLAGS+=" -X k8s.io/component-base/version.gitTreeState=clean"

PACKAGES=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubemark)
for dir in "$HERE"/cmd/*/; do
    [[ -d "$dir" ]] && PACKAGES+=("./cmd/$(basename "$dir")")
done
(cd "$HERE" && "$GO" build -trimpath -ldflags="$LDFLAGS" -o "$WORK/" "${PACKAGES[@]}")
log "k8s.io/kubernetes and cmd/* built in $((SECONDS - START))s"
(cd "$HERE/etcd" && "$GO" build -trimpath -ldflags="-s -w" -o "$WORK/etcd" .)
log "etcd built in $((SECONDS - START))s"
# `helm version` reports the pinned version, as Helm's own release build (its Makefile) stamps it.
HELM_START=$SECONDS
(cd "$HERE/helm" && "$GO" build -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    -o "$WORK/helm" helm.sh/helm/v3/cmd/helm)
log "helm built in $((SECONDS - HELM_START))s"
log "all built in $((SECONDS - START))s:"
ls -l "$WORK" >&2

date -u +%Y-%m-%dT%H:%M:%SZ >"$WORK/.complete"
rm -rf "$OUT"
mv "$WORK" "$OUT"
trap - EXIT
echo "$OUT"
