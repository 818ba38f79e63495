#!/usr/bin/env bash
# Builds the relay's and the consumer's images from the Dockerfile where no image registry is
# reachable: Debian's podman, with the Dockerfile's base (debian:bookworm-slim) made by
# debootstrap from Debian's package registry and cached in $OUTBOX_IMAGE_CACHE
# (/var/cache/outbox-relay/image). The Dockerfile's builder stage needs rust:1-bookworm from a
# registry, so the binaries are built here instead (this machine is Debian 12, the runtime's
# release: the same glibc) and the Dockerfile's own `runtime`, `relay` and `inbox` stages put
# them in, each `COPY --from=…-build` taken from the build context instead. With a registry,
# `docker build .` does all of it.
#
#   scripts/build-image.sh [TAG_PREFIX]   localhost/outbox-relay:dev, localhost/outbox-inbox:dev
#
# Needs root (debootstrap, podman's storage). Containers run with runc: crun refuses a host
# whose cgroups are mixed v1 and v2, as some CI sandboxes' are.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# shellcheck source=scripts/lib/debian.sh
. "$REPO/scripts/lib/debian.sh"

prefix=${1:-localhost}
CACHE=${OUTBOX_IMAGE_CACHE:-/var/cache/outbox-relay/image}
BASE=docker.io/library/debian:bookworm-slim
RUNTIME=localhost/outbox-relay-runtime:dev

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} with apt"
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends \
        podman runc debootstrap uidmap
fi

# The base: Debian 12's minimal root, made once; an interrupted debootstrap leaves only its
# staging directory behind.
if ! "${sudo[@]}" podman image exists "$BASE"; then
    root=$CACHE/bookworm-root
    if [ ! -f "$root/.complete" ]; then
        "${sudo[@]}" mkdir -p "$CACHE"
        staging=$("${sudo[@]}" mktemp -d "$CACHE/.staging-XXXXXX")
        echo "debootstrap of Debian bookworm from $(mirror) for the image's base"
        if ! "${sudo[@]}" debootstrap --variant=minbase bookworm "$staging/root" "$(mirror)" \
            >"$staging.log" 2>&1; then
            echo "debootstrap failed; the end of its log ($staging.log):" >&2
            tail -n 20 "$staging.log" >&2
            exit 1
        fi
        "${sudo[@]}" rm -rf "$staging/root/var/cache/apt/archives/"*.deb \
            "$staging/root/usr/share/doc" "$staging/root/usr/share/man"
        "${sudo[@]}" touch "$staging/root/.complete"
        "${sudo[@]}" rm -rf "$root"
        "${sudo[@]}" mv "$staging/root" "$root"
        "${sudo[@]}" rm -rf "$staging" "$staging.log"
    fi
    "${sudo[@]}" tar -C "$root" --exclude ./.complete -c . | "${sudo[@]}" podman import - "$BASE" >/dev/null
    echo "base image $BASE imported from $root"
fi

cargo build --release --locked -p outbox-relay --bin outbox-relay -p outbox-inbox --bin outbox-inbox

# The chroot isolation needs no cgroups; the host's network reaches Debian's mirror.
"${sudo[@]}" podman build --quiet --isolation chroot --network host --target runtime \
    -t "$RUNTIME" -f Dockerfile . >/dev/null

# One of the Dockerfile's final stages over $RUNTIME, its binary from the context.
final_stage() {
    local stage=$1 binary=$2 context
    context=$(mktemp -d)
    install -s -m 0755 "target/release/$binary" "$context/"
    awk -v stage="$stage" '
        /^FROM / { inside = ($0 == "FROM runtime AS " stage) }
        inside' Dockerfile |
        sed -e "s|^FROM runtime AS $stage\$|FROM $RUNTIME|" \
            -e "s|^COPY --from=$stage-build /usr/local/bin/$binary /usr/local/bin/\$|COPY $binary /usr/local/bin/|" \
            >"$context/Containerfile"
    if ! grep -q "^COPY $binary /usr/local/bin/\$" "$context/Containerfile"; then
        echo "the Dockerfile's $stage stage no longer copies /usr/local/bin/$binary from $stage-build:" >&2
        cat "$context/Containerfile" >&2
        exit 1
    fi
    "${sudo[@]}" podman build --quiet --isolation chroot -t "$prefix/$binary:dev" \
        -f "$context/Containerfile" "$context" >/dev/null
    rm -rf "$context"
    echo "built $prefix/$binary:dev"
}
final_stage relay outbox-relay
final_stage inbox outbox-inbox
