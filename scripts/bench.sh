#!/usr/bin/env bash
# The benchmark of docs/benchmarks.md, on one Debian 12 machine, with nothing else running:
#
#   scripts/bench.sh                 full scale (200,000-row backlogs, 30 s loads; 23 min on
#                                    2 cores, 2026-12-02), the 3-node cluster section last (--no-cluster
#                                    leaves it out)
#   scripts/bench.sh --quick         reduced scale, every scenario (a few minutes; no cluster
#                                    section unless --cluster)
#   scripts/bench.sh --cluster-only  only the 3-node cluster, quorum queue section (~4-6 min;
#                                    --cluster-rounds 3: the consumer-less pair three times)
#   scripts/bench.sh --pin-broker --no-cluster --single-node-pairs 3
#                                    the single-node suite with RabbitMQ on a CPU of its own
#                                    (as on production hosts), three adjacent pairs of the WAL
#                                    drain and the minimal publisher (19 min, 2026-12-05)
#
# Both full and --quick include the drain of every setup (chart 1): after scenario 1,
# the backlog drained once with a consumer and once with none by the WAL reader, 1, 2 and 5
# polling workers, 2 sharded relays and the WAL reader on outbox_emit events (the drains of
# --compare, --shards-sweep and --emit, one round each; scenario 1's consumer-attached drains
# reused: nine drains, 191 s at full scale), and in the cluster section the WAL drain with no
# consumer and the minimal publisher both ways (the whole cluster section: 167 s). The modes below run
# instead of the suite:
#   scripts/bench.sh --shards-sweep 1,2,4 --rows 100000 --ab-rounds 5
#                                    only drains with 1, 2 and 4 sharded relays (~5 min)
#   scripts/bench.sh --emit --rows 100000 --ab-rounds 3
#                                    only writers and drains of rows vs outbox_emit (~5 min)
#   scripts/bench.sh --cost-growth --rows 100000 --ab-rounds 3
#                                    only how cost grows: drains with 1, 2, 4 sharded relays and
#                                    one relay at ~1 KiB and ~16 KiB payloads on the single node
#                                    (each beside the broker alone), then 1, 2, 4 shards on a
#                                    3-node cluster (--no-cluster leaves it out); CPU per message
#                                    of relays, walsenders, PostgreSQL, RabbitMQ (7 min on
#                                    2 cores, 2026-12-04, the cluster's start included)
#   scripts/bench.sh --compare wal,poll:1,poll:5,poll:5x1000 --rows 100000 --ab-rounds 5
#                                    only drains of setups of one relay: WAL, polling workers
#                                    (poll:WORKERS[xBATCH][:delete]) beside the broker alone; ratios
#                                    to the first setup (--no-consumer: queue depth instead
#                                    of a consumer; --compare-latency: p50/p99 at 100 rows/s)
#
# Installs PostgreSQL and RabbitMQ if missing, builds the release binaries, starts a private
# PostgreSQL and RabbitMQ node on free ports (servers on 5432/5672 are left alone), runs
# `outbox-bench bench` against target/release/outbox-relay, and removes both servers on any
# exit (the cluster section's three nodes are started and stopped by outbox-bench itself,
# also on free ports). Prints the Markdown report and writes it with the figures as JSON to
# target/bench/<UTC timestamp>.{md,json}; relay logs and the run's SVG charts (drain.svg,
# latency.svg, cpu.svg, window.svg: those the run has figures for) go to
# target/bench/<timestamp>/. To draw the charts of an earlier run again, without running it:
#   target/release/outbox-bench charts target/bench/<timestamp>.json [--out DIR]
# A run worth keeping is copied by hand to crates/outbox-bench/lab/results/ and read in a
# record in crates/outbox-bench/lab/records/ (crates/outbox-bench/lab/README.md).
#
# Any other argument is passed to `outbox-bench bench` (e.g. --rows 50000, --sweep 1024,4096,
# --max-in-flight 4096; `target/release/outbox-bench bench --help` lists them).

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$REPO/target/bench/$STAMP

# shellcheck source=scripts/lib/stack.sh
. "$REPO/scripts/lib/stack.sh"

# 100 concurrent writers plus relay workers, the consumer and the bench's own connections
# exceed the default 100 connections.
STACK_PG_CONF="max_connections = 300"

stack_packages
stack_build
stack_start bench

rabbit_version=$(svc_rabbit rabbitmqctl -n "$RABBIT_NODE" version 2>/dev/null || echo unknown)
commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit+dirty"
fi
mkdir -p "$OUT"
say "outbox-bench bench $* (relay $commit, RabbitMQ $rabbit_version; logs in $OUT)"
"$BIN/outbox-bench" bench \
    --relay-bin "$BIN/outbox-relay" \
    --work-dir "$OUT" \
    --out "$OUT" \
    --rabbitmq-version "$rabbit_version" \
    --relay-commit "$commit" \
    --started-at "$STAMP" \
    "$@"
