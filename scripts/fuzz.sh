#!/usr/bin/env bash
# Coverage-guided fuzzing of the relay's parsers of untrusted input with AFL++ through afl.rs
# (cargo-afl), on the stable toolchain (docs/testing.md, "Fuzzing"). The targets are the
# binaries of fuzz/; their checks are in src/fuzzing.rs.
#
#   scripts/fuzz.sh TARGET [SECONDS]   fuzz one target (default 60 s), from its seeds in
#                                      fuzz/corpus/TARGET; findings in fuzz/out/TARGET
#   scripts/fuzz.sh --all SECONDS      every target in turn, SECONDS each (CI: 10)
#   scripts/fuzz.sh --list             the targets
#
# Installs cargo-afl (with the AFL++ it builds) into /var/cache/outbox-relay/cargo-afl (when
# that cannot be written, ~/.cache/outbox-relay/cargo-afl), or $OUTBOX_FUZZ_CACHE, if it is
# missing. The instrumented build goes to fuzz/target, or
# $OUTBOX_FUZZ_TARGET_DIR. Exits 1 if any target found a crash or a hang, after printing the
# target, the input's path, the input itself in base64 (a CI clone is gone afterwards) and
# the command that replays it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The afl crate in fuzz/Cargo.lock and the cargo-afl that builds with it: one version.
AFL_VERSION=0.18.2

targets() {
    sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^outbox-fuzz$'
}

usage() {
    echo "usage: scripts/fuzz.sh TARGET [SECONDS] | --all SECONDS | --list" >&2
    echo "targets: $(targets | tr '\n' ' ')" >&2
    exit 2
}

selected=()
seconds=60
case ${1:-} in
    --list)
        targets
        exit 0
        ;;
    --all)
        [ $# -eq 2 ] || usage
        mapfile -t selected < <(targets)
        seconds=$2
        ;;
    "" | -*)
        usage
        ;;
    *)
        [ $# -le 2 ] || usage
        targets | grep -qx "$1" || usage
        selected=("$1")
        seconds=${2:-60}
        ;;
esac
[[ $seconds =~ ^[0-9]+$ ]] && [ "$seconds" -gt 0 ] || usage

if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck source=/dev/null
    . "$HOME/.cargo/env"
fi

cache=${OUTBOX_FUZZ_CACHE:-}
if [ -z "$cache" ]; then
    cache=/var/cache/outbox-relay/cargo-afl
    mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] ||
        cache=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/cargo-afl
fi
export PATH=$cache/bin:$PATH
if ! cargo afl --version 2>/dev/null | grep -q "^cargo-afl $AFL_VERSION "; then
    echo "=== installing cargo-afl $AFL_VERSION into $cache"
    cargo install --locked --root "$cache" cargo-afl --version "$AFL_VERSION"
fi
# cargo-afl builds AFL++ for this rustc when it is installed; a new rustc needs it again.
if ! cargo afl --version | grep -q 'AFL++ version'; then
    cargo afl config --build --force
fi

export CARGO_TARGET_DIR=${OUTBOX_FUZZ_TARGET_DIR:-$PWD/fuzz/target}
started=$SECONDS
cargo afl build --release --locked --manifest-path fuzz/Cargo.toml --bins
echo "=== the instrumented build took $((SECONDS - started)) s"

# The machine's settings are not ours to change (afl-system-config): run without them. No
# core pattern check (a crash is seen all the same), no CPU binding (the other jobs of the
# machine hold the cores), no status screen.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1 AFL_NO_UI=1
# A panic prints no backtrace under AFL: symbolizing one took over the 1 s timeout on a busy
# machine, and the crash was saved as a hang (the replay command prints it).
export RUST_BACKTRACE=0

out=fuzz/out
found=()
for target in "${selected[@]}"; do
    dir=$out/$target
    rm -rf "$dir"
    mkdir -p "$dir"
    echo "=== fuzzing $target for $seconds s"
    # -t: a parse of a few bytes that takes a second is a finding (a hang), not slowness.
    if ! cargo afl fuzz -V "$seconds" -t 1000 -i "fuzz/corpus/$target" -o "$dir" \
        "$CARGO_TARGET_DIR/release/$target" >"$dir/afl.log" 2>&1; then
        tail -n 30 "$dir/afl.log" >&2
        echo "=== afl-fuzz could not run $target (its log: $dir/afl.log)" >&2
        found+=("$target: afl-fuzz failed")
        continue
    fi
    stats=$dir/default/fuzzer_stats
    figure() { sed -n "s/^$1 *: //p" "$stats"; }
    echo "=== $target: $(figure execs_done) execs ($(figure execs_per_sec)/s), corpus $(figure corpus_count), edges $(figure edges_found)/$(figure total_edges), crashes $(figure saved_crashes), hangs $(figure saved_hangs)"
    shown=0
    for input in "$dir"/default/crashes/id:* "$dir"/default/hangs/id:*; do
        [ -f "$input" ] || continue
        case $input in */crashes/*) kind=crash ;; *) kind=hang ;; esac
        found+=("$target: $kind $input")
        # The first few in full: one finding tends to be found many times over.
        shown=$((shown + 1))
        [ "$shown" -le 3 ] || continue
        echo "=== $target: $kind on $input" >&2
        echo "    base64: $(base64 -w0 "$input")" >&2
        echo "    replay: $CARGO_TARGET_DIR/release/$target < '$input'" >&2
        echo "    once fixed, keep it: cp '$input' fuzz/regressions/$target/" >&2
    done
done

if [ "${#found[@]}" -gt 0 ]; then
    echo "=== fuzzing found:" >&2
    printf '    %s\n' "${found[@]}" >&2
    exit 1
fi
echo "=== fuzzing: ${#selected[@]} targets, $seconds s each, no crash and no hang"
