#!/usr/bin/env bash
# Installs the RabbitMQ brokers the tests run on besides Debian 12's own 3.10: each series
# listed in crates/outbox-testkit/rabbitmq-versions (4.0 from Debian 13, 4.3 from Debian
# testing), as a Debian root made by debootstrap from Debian's package registry. Their
# Erlang needs a newer glibc than Debian 12's, so the test kit starts them with chroot
# (crates/outbox-testkit/src/rabbit_release.rs), on ports and an epmd of their own.
#
#   scripts/install-rabbitmq.sh              every listed series
#   scripts/install-rabbitmq.sh 4.0          only these
#   scripts/install-rabbitmq.sh --refresh 4.3   build it again (Debian testing moves)
#   scripts/install-rabbitmq.sh --root 4.0   prints where 4.0's root is (3.10: /)
#
# Each goes to $OUTBOX_TEST_RABBITMQ_CACHE/<series>/root (default
# /var/cache/outbox-relay/rabbitmq), about 370 MB and 40 s to 3 min each, with the
# mirror of apt's sources ($OUTBOX_DEBIAN_MIRROR overrides it). Idempotent: a series already
# installed is skipped. Needs root (debootstrap); installs debootstrap with apt if missing.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIST=$REPO/crates/outbox-testkit/rabbitmq-versions
CACHE=${OUTBOX_TEST_RABBITMQ_CACHE:-/var/cache/outbox-relay/rabbitmq}

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

# "SERIES SUITE SCRIPT" lines of the list, comments and blank lines left out.
listed() {
    grep -v -e '^#' -e '^[[:space:]]*$' "$LIST"
}

listed_field() {
    listed | awk -v series="$1" -v field="$2" '$1 == series { print $field }'
}

root_dir() {
    if [ "$1" = 3.10 ]; then
        echo /
        return 0
    fi
    if [ -z "$(listed_field "$1" 2)" ]; then
        echo "RabbitMQ $1 is not listed in $LIST (listed: 3.10 $(listed | awk '{ print $1 }' | xargs))" >&2
        return 1
    fi
    echo "$CACHE/$1/root"
}

# shellcheck source=scripts/lib/debian.sh
. "$REPO/scripts/lib/debian.sh"

# The rabbitmq-server version installed in a root, e.g. 4.0.5-6+deb13u2.
installed_version() {
    "${sudo[@]}" chroot "$1" dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null
}

refresh=
series_list=()
while [ $# -gt 0 ]; do
    case $1 in
        --root)
            root_dir "${2:?--root SERIES}"
            exit
            ;;
        --refresh)
            refresh=yes
            ;;
        -*)
            echo "usage: scripts/install-rabbitmq.sh [--refresh] [SERIES ...] | --root SERIES" >&2
            exit 2
            ;;
        *)
            series_list+=("$1")
            ;;
    esac
    shift
done
if [ "${#series_list[@]}" -eq 0 ]; then
    mapfile -t series_list < <(listed | awk '{ print $1 }')
fi

todo=()
for series in "${series_list[@]}"; do
    [ "$series" != 3.10 ] || continue
    root=$(root_dir "$series")
    if [ -z "$refresh" ] && [ -f "$root/.installed" ]; then
        echo "RabbitMQ $series: $(cat "$root/.installed") already in $root"
    else
        todo+=("$series")
    fi
done
[ "${#todo[@]}" -gt 0 ] || exit 0

if ! command -v debootstrap >/dev/null; then
    if ! command -v apt-get >/dev/null; then
        echo "debootstrap is missing and there is no apt-get to install it" >&2
        exit 1
    fi
    echo "installing debootstrap with apt"
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends debootstrap
fi

"${sudo[@]}" mkdir -p "$CACHE"
for series in "${todo[@]}"; do
    suite=$(listed_field "$series" 2)
    script=/usr/share/debootstrap/scripts/$(listed_field "$series" 3)
    root=$(root_dir "$series")
    echo "RabbitMQ $series: debootstrap of Debian $suite with rabbitmq-server from $(mirror) into $root"
    # Built aside and moved into place whole: an interrupted install leaves no half a root.
    staging=$("${sudo[@]}" mktemp -d "$CACHE/.staging-$series-XXXXXX")
    log=$staging.log
    if ! "${sudo[@]}" debootstrap --variant=minbase --include=rabbitmq-server \
        "$suite" "$staging/root" "$(mirror)" "$script" >"$log" 2>&1; then
        echo "debootstrap failed; the end of its log ($log):" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    version=$(installed_version "$staging/root")
    case $version in
        "$series".*) ;;
        *)
            echo "Debian $suite's rabbitmq-server is $version, not the $series series: update $LIST" >&2
            exit 1
            ;;
    esac
    # The nodes run as root inside the root (the package's rabbitmq user has a uid that
    # names another user here) and share this cookie with the CLI tools, as one machine's do.
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' | "${sudo[@]}" tee "$staging/root/root/.erlang.cookie" >/dev/null
    "${sudo[@]}" chmod 400 "$staging/root/root/.erlang.cookie"
    # The kit binds the running host's (or test host's) hosts file over this one: a node
    # named n@localhost, or after a test host, must resolve its own name.
    "${sudo[@]}" cp /etc/hosts "$staging/root/etc/hosts"
    # Only what the nodes need: no package cache, no manuals.
    "${sudo[@]}" rm -rf "$staging/root/var/cache/apt/archives/"*.deb "$staging/root/usr/share/doc" \
        "$staging/root/usr/share/man"
    echo "$version" | "${sudo[@]}" tee "$staging/root/.installed" >/dev/null
    "${sudo[@]}" rm -rf "$CACHE/$series"
    "${sudo[@]}" mkdir -p "$CACHE/$series"
    "${sudo[@]}" mv "$staging/root" "$root"
    "${sudo[@]}" rm -rf "$staging" "$log"
    echo "RabbitMQ $series: rabbitmq-server $version in $root"
done
