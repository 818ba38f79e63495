# shellcheck shell=bash
# What the scripts that debootstrap a Debian root share (scripts/install-rabbitmq.sh,
# scripts/build-image.sh).

# The Debian mirror: $OUTBOX_DEBIAN_MIRROR, else the first this machine's apt uses, else
# deb.debian.org.
mirror() {
    if [ -n "${OUTBOX_DEBIAN_MIRROR:-}" ]; then
        echo "$OUTBOX_DEBIAN_MIRROR"
        return 0
    fi
    local found
    found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n 1 | tr -d ' ' || true)
    echo "${found:-http://deb.debian.org/debian}"
}
