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

RELAY_PID=

# shellcheck source=scripts/lib/stack.sh
. "$REPO/scripts/lib/stack.sh"

# Called by the cleanup on any exit, before the servers go.
stack_on_exit() {
    if [ -n "$RELAY_PID" ] && kill -0 "$RELAY_PID" 2>/dev/null; then
        say "stopping the relay"
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$RELAY_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$RELAY_PID" 2>/dev/null || true
    fi
    if [ "$1" = 0 ]; then
        say "done; the relay's log: ${RELAY_LOG:-}"
    fi
}

# --- 1. packages -------------------------------------------------------------------------
stack_packages

# --- 2. build ----------------------------------------------------------------------------
stack_build
RELAY=$BIN/outbox-relay
BENCH=$BIN/outbox-bench

# --- 3. private servers ------------------------------------------------------------------
stack_start demo
RELAY_LOG=$WORK/relay.log

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
