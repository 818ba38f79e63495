# shellcheck shell=bash
# shellcheck disable=SC2034 # sets variables for the scripts that source it
# The steps scripts/demo.sh and scripts/bench.sh share (sourced, not run), on one Debian 12
# machine: packages, the release build, private servers in a work dir, and a cleanup that
# removes them on any exit (failure and Ctrl-C included).
#
#   stack_packages              apt-get install what is missing
#   stack_build                 cargo build --release of outbox-relay and outbox-bench -> BIN
#                               (target/release, or $CARGO_TARGET_DIR/release)
#   stack_start NAME            private PostgreSQL + RabbitMQ in a temp dir -> WORK, PG_URL,
#                               RABBIT_URL (see services.sh); exports DATABASE_URL, AMQP_URL
#
# The caller sets REPO, and may define stack_on_exit (called first by the cleanup, with the
# exit status: stop what it started) and STACK_PG_CONF (extra postgresql.conf lines).

say() { printf '==> %s\n' "$*"; }
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}
indent() { sed -u 's/^/    /'; }

if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null 2>&1; then
    die "run this as root, or install sudo"
fi
# shellcheck source=scripts/lib/services.sh
. "$REPO/scripts/lib/services.sh"

stack_packages() {
    local missing=()
    case ${OUTBOX_TEST_PG_MAJOR:-15} in
        15) svc_pg_bin >/dev/null 2>&1 || missing+=(postgresql) ;;
        *) "$REPO/scripts/install-postgres.sh" "$OUTBOX_TEST_PG_MAJOR" ;;
    esac
    case $(svc_rabbit_series) in
        3.10) [ -x /usr/sbin/rabbitmq-server ] || missing+=(rabbitmq-server) ;;
        *) "$REPO/scripts/install-rabbitmq.sh" "$(svc_rabbit_series)" ;;
    esac
    command -v cc >/dev/null 2>&1 || missing+=(build-essential)
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} with apt"
        $SUDO apt-get update -q
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
}

# Under `sudo scripts/….sh`, build as the user who ran sudo: their cargo, and a target/ they
# still own afterwards.
stack_in_repo() {
    local build_as=()
    if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        build_as=(runuser -u "$SUDO_USER" --)
    fi
    # shellcheck disable=SC2016 # expanded by the inner shell, as the building user
    "${build_as[@]}" bash -c 'if [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
        cd "$0" && exec "$@"' "$REPO" "$@"
}

stack_build() {
    local started=$SECONDS
    if ! stack_in_repo cargo --version >/dev/null 2>&1; then
        cat >&2 <<'EOF'
error: cargo not found. Install Rust with rustup, then run this script again:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . "$HOME/.cargo/env"
EOF
        exit 1
    fi
    say "building the release binaries (cargo build --release -p outbox-relay -p outbox-bench)"
    # Both packages by name: a plain `cargo build` at the workspace root builds the relay only.
    stack_in_repo cargo build --release -p outbox-relay -p outbox-bench
    say "built in $((SECONDS - started)) s"
    # Cargo puts them under CARGO_TARGET_DIR when it is set.
    BIN=${CARGO_TARGET_DIR:-$REPO/target}/release
}

stack_cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    if declare -F stack_on_exit >/dev/null; then
        stack_on_exit "$status"
    fi
    if [ -n "${RABBIT_DIR:-}" ] || [ -n "${PG_DIR:-}" ]; then
        say "stopping and removing the private RabbitMQ and PostgreSQL"
    fi
    if [ "$status" != 0 ]; then
        # Keep the servers' logs for a look at what went wrong.
        [ -n "${PG_DIR:-}" ] && $SUDO cat "$PG_DIR/postgres.log" >"$WORK/postgres.log" 2>/dev/null
        [ -n "${RABBIT_DIR:-}" ] && $SUDO cat "$RABBIT_DIR/log/$RABBIT_NODE.log" >"$WORK/rabbitmq.log" 2>/dev/null
    fi
    svc_rabbit_stop
    svc_pg_stop
    $SUDO rm -rf "$WORK/pg" "$WORK/rabbit"
    # The node starts epmd if none ran; stop it again (it refuses while a node is registered).
    if [ -z "$EPMD_WAS_RUNNING" ] && svc_port_open 4369; then
        $SUDO runuser -u rabbitmq -- epmd -kill >/dev/null 2>&1
    fi
    if [ "$status" = 0 ]; then
        rm -f "$WORK/initdb.log" "$WORK/rabbit-startup.log"
    else
        printf '%s failed (exit %s); logs kept in %s\n' "$(basename "$0")" "$status" "$WORK" >&2
    fi
    exit "$status"
}

stack_start() {
    local name=$1 rabbit_started
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-$name.XXXXXX")
    chmod 755 "$WORK"
    EPMD_WAS_RUNNING=
    svc_port_open 4369 && EPMD_WAS_RUNNING=yes
    trap stack_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    # With output through a pipe (`… | tee log`), Ctrl-C also ends the reader: a write must
    # then fail (and exit through the cleanup), not kill this script with SIGPIPE.
    trap '' PIPE

    say "starting a private PostgreSQL"
    SVC_PG_CONF=${STACK_PG_CONF:-}
    svc_pg_start "$WORK" || die "cannot start PostgreSQL"
    say "PostgreSQL $PG_URL (wal_level=logical, data in $PG_DIR)"
    say "starting a private RabbitMQ node (about 10 s)"
    rabbit_started=$SECONDS
    svc_rabbit_start "$WORK" || die "cannot start RabbitMQ"
    say "RabbitMQ node $RABBIT_NODE on 127.0.0.1:$RABBIT_PORT (ready in $((SECONDS - rabbit_started)) s)"
    # The URLs go through the environment, not argv, as a deployment would pass secrets.
    export DATABASE_URL=$PG_URL AMQP_URL=$RABBIT_URL
}
