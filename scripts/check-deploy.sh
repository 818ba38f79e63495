#!/usr/bin/env bash
# Checks the deployment files of deploy/ offline, with the tools their formats are for:
#
#   promtool check rules / test rules   deploy/prometheus/alerts.yml and its unit tests (which
#                                       must make every alert fire and stay silent; and
#                                       docs/metrics.md lists every alert)
#   kubernetes-validate --strict        every manifest of deploy/kubernetes/ (the ServiceMonitor,
#                                       a CRD it has no schema for, against
#                                       scripts/lib/servicemonitor.schema.json), and what the
#                                       manifests promise beyond their schemas: the image of
#                                       Cargo.toml's version, the security context, probes,
#                                       selectors and ports that match
#   systemd-analyze verify              deploy/systemd/outbox-relay.service
#   metric names                        alerts.yml, its tests and docs/grafana-dashboard.json
#                                       name only metrics the relay exports
#
# Whether the relay accepts every command, flag and variable the files use is checked by
# tests/packaging.rs against the binary's --help; that test also runs this script.
#
#   scripts/check-deploy.sh     (as root on Debian 12; OUTBOX_RELAY_BIN: the relay's binary,
#                                default target/debug/outbox-relay, built if missing)
#
# What is missing is installed and kept under /var/cache/outbox-relay (OUTBOX_DEPLOY_CACHE):
# promtool from Debian's prometheus package, unpacked there (installing the package would
# also start a Prometheus server), and kubernetes-validate from PyPI in a venv there
# (python3-venv from apt). systemd-analyze comes with Debian's systemd package.
# Runs every check, then exits 1 naming each that failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD

cache=${OUTBOX_DEPLOY_CACHE:-/var/cache/outbox-relay}
kubernetes_validate_version=1.37.0
promtool=$cache/prometheus/usr/bin/promtool
venv=$cache/venv-kubernetes-validate

say() { printf '%s\n' "$*"; }
die() {
    say "check-deploy: $*" >&2
    exit 1
}

apt_updated=
apt_update() {
    if [ -z "$apt_updated" ]; then
        apt-get update -qq
        apt_updated=1
    fi
}
apt_install() {
    apt_update
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---------------------------------------------------------------------------------------
# Tools. One installer at a time: two runs at once share the cache.

mkdir -p "$cache"
exec 9>"$cache/.check-deploy.lock"
flock 9

if [ ! -x "$promtool" ]; then
    say "installing promtool (Debian's prometheus package, unpacked into $cache/prometheus)"
    apt_update
    unpack=$(mktemp -d "$cache/prometheus.XXXXXX")
    # apt downloads as the _apt user where it can write (else as root, with a warning).
    chown _apt "$unpack" 2>/dev/null || true
    (cd "$unpack" && apt-get download -qq prometheus)
    dpkg-deb -x "$unpack"/prometheus_*.deb "$unpack/root"
    rm -rf "$cache/prometheus"
    mv "$unpack/root" "$cache/prometheus"
    rm -rf "$unpack"
fi

# A venv is not relocatable, so it is built in place; the marker says it was finished.
if [ ! -e "$venv/.complete-$kubernetes_validate_version" ]; then
    say "installing kubernetes-validate $kubernetes_validate_version (PyPI) into $venv"
    if ! /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null; then
        apt_install python3 python3-venv
    fi
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
        "kubernetes-validate==$kubernetes_validate_version"
    touch "$venv/.complete-$kubernetes_validate_version"
fi

if ! command -v systemd-analyze >/dev/null; then
    say "installing systemd-analyze (Debian's systemd package)"
    apt_install systemd
fi

flock -u 9

relay=${OUTBOX_RELAY_BIN:-$repo/target/debug/outbox-relay}
if [ ! -x "$relay" ]; then
    if [ -n "${OUTBOX_RELAY_BIN:-}" ] || ! command -v cargo >/dev/null; then
        die "no relay binary at $relay: build it (cargo build) or set OUTBOX_RELAY_BIN"
    fi
    say "building the relay (cargo build), for the metric names and the systemd check"
    cargo build --locked -q -p outbox-relay --bin outbox-relay
fi

# ---------------------------------------------------------------------------------------
# Checks: each runs and shows its output; the script fails at the end if any failed.

failed=()
check() {
    local name=$1
    shift
    local started=$SECONDS out
    if out=$("$@" 2>&1); then
        say "ok   $name ($((SECONDS - started)) s)"
    else
        say "FAIL $name"
        failed+=("$name")
    fi
    [ -z "$out" ] || say "$out" | sed 's/^/     /'
}

# systemd-analyze verify exits 0 on a line it ignores ("Failed to parse time value,
# ignoring"), so any line about the unit fails too. It also checks that ExecStart's binary
# exists: a copy of the unit runs the relay built here instead of /usr/local/bin/outbox-relay.
verify_unit() {
    local unit=$1 dir out status=0
    dir=$(mktemp -d)
    grep -q '^ExecStart=/usr/local/bin/outbox-relay ' "$unit" \
        || { say "$unit: ExecStart is not /usr/local/bin/outbox-relay …"; return 1; }
    sed "s#^ExecStart=/usr/local/bin/outbox-relay #ExecStart=$relay #" "$unit" \
        >"$dir/$(basename "$unit")"
    out=$(systemd-analyze verify "$dir/$(basename "$unit")" 2>&1) || status=$?
    rm -rf "$dir"
    say "$out"
    [ "$status" = 0 ] && ! grep -q "$(basename "$unit")" <<<"$out"
}

say "checking deploy/ ($("$promtool" --version 2>&1 | head -n 1); kubernetes-validate \
$kubernetes_validate_version; $(systemd-analyze --version | head -n 1))"
check "promtool check rules deploy/prometheus/alerts.yml" \
    "$promtool" check rules deploy/prometheus/alerts.yml
check "promtool test rules deploy/prometheus/alerts.test.yml" \
    "$promtool" test rules deploy/prometheus/alerts.test.yml
check "every alert tested firing and silent, and listed in docs/metrics.md" \
    "$venv/bin/python" scripts/lib/check_deploy.py alerts "$repo"
check "deploy/kubernetes: kubernetes-validate --strict, and what the manifests promise" \
    "$venv/bin/python" scripts/lib/check_deploy.py manifests "$repo"
for unit in deploy/systemd/*.service; do
    check "systemd-analyze verify $unit" verify_unit "$unit"
done
check "metric names of the alerts and the Grafana dashboard" \
    "$venv/bin/python" scripts/lib/check_deploy.py metrics "$repo" "$relay" \
    deploy/prometheus/alerts.yml deploy/prometheus/alerts.test.yml docs/grafana-dashboard.json

if [ ${#failed[@]} -gt 0 ]; then
    say "check-deploy: ${#failed[@]} check(s) failed:"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
say "check-deploy: all checks passed"
