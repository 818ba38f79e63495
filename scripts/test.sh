#!/usr/bin/env bash
# The full check of the whole workspace (the relay, crates/outbox-bench, crates/outbox-testkit):
# formatting, clippy, and every test target against private PostgreSQL and RabbitMQ instances
# that the test harness starts itself. One cargo run per step covers every member, in the
# workspace's one target dir.
#
# On Debian it first installs the server packages if they are missing, and docker-compose
# (tests/packaging.rs validates docker-compose.yml with `docker-compose config`; no Docker
# engine needed), iproute2 and nftables (tests/partitions.rs puts the servers on network
# namespaces of their own and cuts the links between them with nftables rules). A fresh
# rabbitmq-server package starts a system node: harmless, the tests use their own.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

need_packages=()
if [ ! -x /usr/lib/postgresql/15/bin/initdb ]; then
    need_packages+=(postgresql)
fi
if [ ! -x /usr/sbin/rabbitmq-server ]; then
    need_packages+=(rabbitmq-server)
fi
if ! command -v docker-compose >/dev/null; then
    need_packages+=(docker-compose)
fi
if ! command -v ip >/dev/null; then
    need_packages+=(iproute2)
fi
if ! command -v nft >/dev/null; then
    need_packages+=(nftables)
fi
if [ "${#need_packages[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "missing ${need_packages[*]} and no apt-get to install them" >&2
        exit 1
    fi
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    echo "installing ${need_packages[*]}"
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends \
        "${need_packages[@]}"
fi

if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi

export RUST_BACKTRACE=1

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Plain cargo test (not nextest): the tests of one binary share one server pair.
cargo test --workspace --all-targets
