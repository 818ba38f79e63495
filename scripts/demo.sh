#!/usr/bin/env bash
# outbox-relay end to end, on one Debian 12 machine, with nothing else running:
#
#   scripts/demo.sh            (as root, or as a user with sudo)
#
# 1. installs PostgreSQL, RabbitMQ and a C toolchain with apt if any is missing;
# 2. builds the release binaries (needs cargo: https://rustup.rs);
# 3. starts a private PostgreSQL (wal_level=logical) and a private RabbitMQ node on free
#    ports in a temp dir; servers already running on 5432/5672 are left alone;
# 4. `outbox-relay setup`, then `outbox-relay run` in the background;
# 5. `outbox-bench demo`: 8 writers commit 5000 outbox rows, a consumer checks that every
#    row arrives, once, in commit order, and reports the rate;
# 6. stops the relay with SIGTERM (it must exit 0) and removes both servers, also on
#    failure or Ctrl-C. The relay's log is kept and its path printed.
#
# Knobs (environment): DEMO_ROWS (5000), DEMO_WRITERS (8), DEMO_MAX_TXN_ROWS (10),
# DEMO_TIMEOUT_SECS (90), OUTBOX_MAX_IN_FLIGHT (the relay's default).

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROWS=${DEMO_ROWS:-5000}
WRITERS=${DEMO_WRITERS:-8}
MAX_TXN_ROWS=${DEMO_MAX_TXN_ROWS:-10}
TIMEOUT_SECS=${DEMO_TIMEOUT_SECS:-90}

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

# --- 1. packages -------------------------------------------------------------------------
missing=()
svc_pg_bin >/dev/null 2>&1 || missing+=(postgresql)
[ -x /usr/sbin/rabbitmq-server ] || missing+=(rabbitmq-server)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} with apt"
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

# --- 2. build ----------------------------------------------------------------------------
# Under `sudo scripts/demo.sh`, build as the user who ran sudo: their cargo, and a target/
# they still own afterwards.
build_as=()
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    build_as=(runuser -u "$SUDO_USER" --)
fi
in_repo() {
    # shellcheck disable=SC2016 # expanded by the inner shell, as the building user
    "${build_as[@]}" bash -c 'if [ -f "$HOME/.cargo/env" ]; then . "$HOME/.cargo/env"; fi
        cd "$0" && exec "$@"' "$REPO" "$@"
}
if ! in_repo cargo --version >/dev/null 2>&1; then
    cat >&2 <<'EOF'
error: cargo not found. Install Rust with rustup, then run this script again:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . "$HOME/.cargo/env"
EOF
    exit 1
fi
say "building the release binaries (cargo build --release --bins)"
build_started=$SECONDS
in_repo cargo build --release --bins
say "built in $((SECONDS - build_started)) s"
BIN=$REPO/target/release
RELAY=$BIN/outbox-relay
BENCH=$BIN/outbox-bench

# --- 3. private servers ------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-demo.XXXXXX")
chmod 755 "$WORK"
RELAY_LOG=$WORK/relay.log
RELAY_PID=
EPMD_WAS_RUNNING=
svc_port_open 4369 && EPMD_WAS_RUNNING=yes

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    if [ -n "$RELAY_PID" ] && kill -0 "$RELAY_PID" 2>/dev/null; then
        say "stopping the relay"
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$RELAY_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$RELAY_PID" 2>/dev/null || true
    fi
    if [ -n "${RABBIT_DIR:-}" ] || [ -n "${PG_DIR:-}" ]; then
        say "stopping and removing the private RabbitMQ and PostgreSQL"
    fi
    if [ "$status" != 0 ]; then
        # Keep the servers' logs next to the relay's for a look at what went wrong.
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
        say "done; the relay's log: $RELAY_LOG"
    else
        printf 'demo failed (exit %s); logs kept in %s\n' "$status" "$WORK" >&2
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# With output through a pipe (`demo.sh | tee log`), Ctrl-C also ends the reader: a write
# must then fail (and exit through the cleanup), not kill this script with SIGPIPE.
trap '' PIPE

say "starting a private PostgreSQL"
svc_pg_start "$WORK" || die "cannot start PostgreSQL"
say "PostgreSQL $PG_URL (wal_level=logical, data in $PG_DIR)"
say "starting a private RabbitMQ node (about 10 s)"
rabbit_started=$SECONDS
svc_rabbit_start "$WORK" || die "cannot start RabbitMQ"
say "RabbitMQ node $RABBIT_NODE on 127.0.0.1:$RABBIT_PORT (ready in $((SECONDS - rabbit_started)) s)"

# The URLs go through the environment, not argv, as a deployment would pass secrets.
export DATABASE_URL=$PG_URL AMQP_URL=$RABBIT_URL

# --- 4. the relay ------------------------------------------------------------------------
say "outbox-relay setup"
"$RELAY" setup 2>&1 | indent

say "starting outbox-relay run (log: $RELAY_LOG)"
RUST_LOG=${RUST_LOG:-info} NO_COLOR=1 "$RELAY" run >"$RELAY_LOG" 2>&1 &
RELAY_PID=$!
waited=0
until grep -qs streaming "$RELAY_LOG"; do
    if ! kill -0 "$RELAY_PID" 2>/dev/null; then
        tail -n 20 "$RELAY_LOG" >&2
        die "the relay exited at startup"
    fi
    [ $waited -lt 300 ] || die "the relay is not streaming after 30 s (see $RELAY_LOG)"
    sleep 0.1
    waited=$((waited + 1))
done
say "the relay is streaming the slot"

# --- 5. the demo -------------------------------------------------------------------------
say "outbox-bench demo: $WRITERS writers, $ROWS rows, transactions of 1..=$MAX_TXN_ROWS rows"
bench_status=0
"$BENCH" demo --rows "$ROWS" --writers "$WRITERS" --max-txn-rows "$MAX_TXN_ROWS" \
    --timeout-secs "$TIMEOUT_SECS" | indent || bench_status=$?

# --- 6. stop -----------------------------------------------------------------------------
say "stopping the relay with SIGTERM"
kill -TERM "$RELAY_PID" 2>/dev/null || say "the relay had already exited"
relay_status=0
wait "$RELAY_PID" || relay_status=$?
RELAY_PID=
if [ "$relay_status" = 0 ]; then
    say "the relay exited 0"
else
    tail -n 20 "$RELAY_LOG" >&2
    say "the relay exited $relay_status"
fi
[ "$bench_status" = 0 ] || die "the demo failed (outbox-bench exited $bench_status)"
[ "$relay_status" = 0 ] || die "the relay did not stop cleanly"
