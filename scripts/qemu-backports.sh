#!/usr/bin/env bash
# A newer QEMU beside Debian 12's 7.2, without replacing it: the
# qemu-system-x86 and qemu-system-data packages of bookworm-backports
# (10.0 when written), fetched with the ordinary apt client (apt-get
# download) and unpacked under target/qemu-backports/VERSION/, with a
# wrapper that points QEMU at its own firmware (-L). Prints the wrapper's
# path. The guest tests take it as --qemu PATH (tests/guest/live.sh).
#
# The backports suite is enabled when missing (scripts/lib/backports.sh),
# derived from the machine's own apt sources (the same URIs and keys; no
# host is named here). Backports are not installed by default (apt pins
# them at 100): nothing else changes.
# Its libraries come from bookworm; the script fails when one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "qemu-backports: $*" >&2; }

# shellcheck source=scripts/lib/backports.sh
source scripts/lib/backports.sh
enable_backports qemu-backports
suite=bookworm-backports
version=$(backports_version qemu-system-x86)
[ -n "$version" ] || { log "no qemu-system-x86 in $suite (apt-get update?)"; exit 1; }
out="$PWD/target/qemu-backports/${version//[:~+]/_}"
wrapper="$out/qemu-system-x86_64"
if [ ! -x "$wrapper" ]; then
    log "fetching qemu-system-x86 $version from $suite"
    rm -rf "$out" && mkdir -p "$out/debs"
    (cd "$out/debs" && apt-get download -qq "qemu-system-x86=$version" "qemu-system-data=$version" 2>/dev/null)
    for d in "$out"/debs/*.deb; do dpkg-deb -x "$d" "$out/root"; done
    missing=$(ldd "$out/root/usr/bin/qemu-system-x86_64" | awk '/not found/ { print $1 }' | tr '\n' ' ')
    [ -z "$missing" ] || { log "libraries missing on this machine: $missing"; exit 1; }
    cat > "$wrapper.tmp" <<EOF
#!/bin/sh
# qemu-system-x86_64 $version (Debian $suite), unpacked by scripts/qemu-backports.sh
exec "$out/root/usr/bin/qemu-system-x86_64" -L "$out/root/usr/share/qemu" "\$@"
EOF
    chmod +x "$wrapper.tmp" && mv "$wrapper.tmp" "$wrapper"
fi
echo "$wrapper"
