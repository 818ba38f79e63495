# shellcheck shell=bash
# shellcheck disable=SC2034 # sets variables for the scripts that source it
# Private PostgreSQL and RabbitMQ servers for scripts (sourced, not run).
#
# Each server lives in a directory under a work dir the caller made, listens on 127.0.0.1
# on free ports, and leaves the system's own servers (5432, 5672) alone. Privileged steps go
# through $SUDO (empty when running as root, "sudo" otherwise).
#
#   svc_pg_start WORKDIR        -> PG_PORT, PG_DIR, PG_URL (SVC_PG_CONF: extra settings)
#   svc_pg_stop
#   svc_rabbit_start WORKDIR    -> RABBIT_NODE, RABBIT_PORT, RABBIT_DIR, RABBIT_URL
#                                  (SVC_RABBIT_NAME: the node name's prefix, outbox-demo)
#   svc_rabbit_stop
#   svc_rabbit PROGRAM ARGS...  rabbitmqctl (or another RabbitMQ program) of the series
#
# The RabbitMQ series is the tests' (OUTBOX_TEST_RABBITMQ: 4.0 by default, 4.3, or Debian
# 12's own 3.10). A 4.x node runs from the Debian root scripts/install-rabbitmq.sh makes, with
# chroot, in a mount namespace that binds /proc, the hosts file and the temp dir into it, as
# root, on the series' own epmd port (crates/outbox-testkit/src/rabbit_release.rs does the
# same for the tests).
#
# Debian's /usr/sbin/rabbitmq-* wrappers, run as root, switch to the rabbitmq user with
# `su` (not a login shell), which keeps the environment: the RABBITMQ_* variables reach the
# node and override /etc/rabbitmq/rabbitmq-env.conf (whose NODENAME would otherwise name
# the system node). The node uses the rabbitmq user's cookie, so `rabbitmqctl -n NODE`
# reaches it, and registers with the system's epmd on 4369 (starting one if none runs).

SUDO=${SUDO-}
SVC_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "$SUDO" ] && [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi

# A TCP port on 127.0.0.1 that nothing listens on, below Linux's ephemeral range (which
# outgoing connections use). Bash's /dev/tcp: a refused connection means the port is free.
svc_free_port() {
    local port tries=0
    while [ $tries -lt 200 ]; do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
        tries=$((tries + 1))
    done
    echo "no free port found" >&2
    return 1
}

svc_port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# The PostgreSQL server binaries: with OUTBOX_TEST_PG_MAJOR, that major version's (16-18 from
# scripts/install-postgres.sh), else the newest installed under /usr/lib/postgresql.
svc_pg_bin() {
    local dir
    if [ -n "${OUTBOX_TEST_PG_MAJOR:-}" ]; then
        dir=$("$SVC_SCRIPTS/install-postgres.sh" --bin-dir "$OUTBOX_TEST_PG_MAJOR") || return 1
        if [ ! -x "$dir/initdb" ]; then
            echo "no PostgreSQL $OUTBOX_TEST_PG_MAJOR in $dir: scripts/install-postgres.sh $OUTBOX_TEST_PG_MAJOR installs it" >&2
            return 1
        fi
        echo "$dir"
        return 0
    fi
    dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$dir" ] || [ ! -x "$dir/initdb" ]; then
        echo "no PostgreSQL server binaries under /usr/lib/postgresql" >&2
        return 1
    fi
    echo "$dir"
}

# initdb into WORKDIR/pg as the postgres user (initdb refuses root) and start the server
# with wal_level=logical on a free port; its unix socket and log stay in that directory.
svc_pg_start() {
    local work=$1 bin attempt
    bin=$(svc_pg_bin) || return 1
    PG_DIR=$work/pg
    mkdir -p "$PG_DIR"
    $SUDO chown postgres: "$PG_DIR"
    if ! $SUDO runuser -u postgres -- "$bin/initdb" -D "$PG_DIR/data" -A trust -U postgres \
        -E UTF8 --locale=C --no-sync >"$work/initdb.log" 2>&1; then
        echo "initdb failed:" >&2
        cat "$work/initdb.log" >&2
        return 1
    fi
    $SUDO runuser -u postgres -- tee -a "$PG_DIR/data/postgresql.conf" >/dev/null <<EOF

# outbox-relay demo
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PG_DIR'
wal_level = logical
max_replication_slots = 10
max_wal_senders = 10
${SVC_PG_CONF:-}
EOF
    # The port was free a moment ago; something else may take it first: retry.
    for attempt in 1 2 3 4 5; do
        PG_PORT=$(svc_free_port) || return 1
        if $SUDO runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" \
            -o "-p $PG_PORT" -w -t 60 start >/dev/null 2>&1; then
            PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
            PG_BIN=$bin
            return 0
        fi
        echo "postgres did not start on port $PG_PORT (attempt $attempt)" >&2
    done
    echo "postgres failed to start; its log:" >&2
    $SUDO tail -n 20 "$PG_DIR/postgres.log" >&2
    return 1
}

svc_pg_stop() {
    # The data dir is the postgres user's (mode 0700): look into it as that user.
    if [ -n "${PG_DIR:-}" ] && $SUDO test -f "$PG_DIR/data/postmaster.pid"; then
        $SUDO runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w -t 30 stop \
            >/dev/null 2>&1 ||
            $SUDO runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop \
                >/dev/null 2>&1 || true
    fi
}

# The RabbitMQ series scripts run: the tests' default, or OUTBOX_TEST_RABBITMQ.
svc_rabbit_series() {
    echo "${OUTBOX_TEST_RABBITMQ:-4.0}"
}

# Runs RabbitMQ program $1 (rabbitmq-server, rabbitmqctl) of the series with the remaining
# arguments. RABBITMQ_* variables of the caller's environment (a prefix of the call will do)
# reach the program, through sudo too.
svc_rabbit() {
    local program=$1 series root epmd temp vars=()
    shift
    mapfile -t vars < <(env | grep '^RABBITMQ_' || true)
    series=$(svc_rabbit_series)
    if [ "$series" = 3.10 ]; then
        $SUDO env "${vars[@]}" "/usr/sbin/$program" "$@"
        return
    fi
    root=$("$SVC_SCRIPTS/install-rabbitmq.sh" --root "$series") || return 1
    epmd=$(awk -v series="$series" '$1 == series { print $4 }' \
        "$SVC_SCRIPTS/../crates/outbox-testkit/rabbitmq-versions")
    temp=${TMPDIR:-/tmp}
    # shellcheck disable=SC2016 # expanded by the inner shell
    $SUDO unshare --mount --propagation private -- sh -c 'set -e; root=$0; temp=$1; shift
        mount -t proc proc "$root/proc"
        mount --bind /etc/hosts "$root/etc/hosts"
        mkdir -p "$root$temp"; mount --bind "$temp" "$root$temp"
        exec chroot "$root" "$@"' "$root" "$temp" \
        /usr/bin/env "${vars[@]}" HOME=/root ERL_EPMD_PORT="$epmd" "/usr/lib/rabbitmq/bin/$program" "$@"
}

# A private RabbitMQ node in WORKDIR/rabbit, owned by the rabbitmq user: its own node
# name, AMQP and distribution ports, mnesia, logs, pid file, plugins and config files.
svc_rabbit_start() {
    local work=$1 started pid
    RABBIT_DIR=$work/rabbit
    RABBIT_NODE="${SVC_RABBIT_NAME:-outbox-demo}-$$@localhost"
    RABBIT_PORT=$(svc_free_port) || return 1
    RABBIT_DIST_PORT=$(svc_free_port) || return 1
    while [ "$RABBIT_DIST_PORT" = "$RABBIT_PORT" ]; do
        RABBIT_DIST_PORT=$(svc_free_port) || return 1
    done
    mkdir -p "$RABBIT_DIR/mnesia" "$RABBIT_DIR/log"
    echo '[].' >"$RABBIT_DIR/enabled_plugins"
    # Replaces /etc/rabbitmq/rabbitmq.conf, whose listener is the system node's port.
    cat >"$RABBIT_DIR/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$RABBIT_PORT
disk_free_limit.absolute = 50MB
EOF
    $SUDO chown -R rabbitmq: "$RABBIT_DIR"
    if ! RABBITMQ_NODENAME="$RABBIT_NODE" \
        RABBITMQ_NODE_PORT="$RABBIT_PORT" \
        RABBITMQ_DIST_PORT="$RABBIT_DIST_PORT" \
        RABBITMQ_MNESIA_BASE="$RABBIT_DIR/mnesia" \
        RABBITMQ_LOG_BASE="$RABBIT_DIR/log" \
        RABBITMQ_PID_FILE="$RABBIT_DIR/pid" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$RABBIT_DIR/enabled_plugins" \
        RABBITMQ_CONFIG_FILE="$RABBIT_DIR/rabbitmq.conf" \
        svc_rabbit rabbitmq-server -detached >"$work/rabbit-startup.log" 2>&1; then
        echo "rabbitmq-server -detached failed:" >&2
        cat "$work/rabbit-startup.log" >&2
        return 1
    fi
    # -detached returns at once; the pid file appears ~2 s later and the AMQP port opens at
    # the end of the boot. Notice a node that dies while booting instead of waiting it out.
    started=$SECONDS
    until svc_port_open "$RABBIT_PORT"; do
        pid=$($SUDO cat "$RABBIT_DIR/pid" 2>/dev/null || true)
        if [ -n "$pid" ] && [ ! -d "/proc/$pid" ]; then
            echo "the rabbitmq node died while booting; its log:" >&2
            svc_rabbit_log_tail >&2
            return 1
        fi
        if [ $((SECONDS - started)) -ge 90 ]; then
            echo "rabbitmq did not open port $RABBIT_PORT in 90 s; its log:" >&2
            svc_rabbit_log_tail >&2
            return 1
        fi
        sleep 0.2
    done
    if ! svc_rabbit rabbitmqctl -n "$RABBIT_NODE" await_startup --timeout 60 \
        >>"$work/rabbit-startup.log" 2>&1; then
        echo "rabbitmqctl await_startup failed:" >&2
        tail -n 20 "$work/rabbit-startup.log" >&2
        return 1
    fi
    RABBIT_URL="amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2f"
}

svc_rabbit_log_tail() {
    $SUDO tail -n 30 "$RABBIT_DIR/log/$RABBIT_NODE.log" 2>/dev/null || true
}

# The node's processes: the pid file's, plus any beam.smp whose environment names the node
# (one that died or hung before writing its pid file).
svc_rabbit_pids() {
    local pid proc
    pid=$($SUDO cat "$RABBIT_DIR/pid" 2>/dev/null || true)
    [ -n "$pid" ] && echo "$pid"
    for proc in /proc/[0-9]*; do
        [ "$(cat "$proc/comm" 2>/dev/null)" = beam.smp ] || continue
        if $SUDO cat "$proc/environ" 2>/dev/null | tr '\0' '\n' |
            grep -qxF "RABBITMQ_NODENAME=$RABBIT_NODE"; then
            echo "${proc#/proc/}"
        fi
    done
}

# SIGTERM (the Erlang VM shuts down cleanly), then SIGKILL after 15 s.
svc_rabbit_stop() {
    local pids pid waited=0
    [ -n "${RABBIT_DIR:-}" ] && [ -d "$RABBIT_DIR" ] || return 0
    pids=$(svc_rabbit_pids | sort -u)
    for pid in $pids; do
        $SUDO kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in $pids; do
        while [ -d "/proc/$pid" ] && [ $waited -lt 150 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        if [ -d "/proc/$pid" ]; then
            $SUDO kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}
