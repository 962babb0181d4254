#!/usr/bin/env bash
# Makes Debian source packages reachable with the ordinary apt client: adds
# a deb-src entry derived from the machine's own apt sources (the same
# URIs, suites and keys; no host is named here), then refreshes the
# package lists. Idempotent: does nothing when source entries exist.
set -euo pipefail

has_src() {
    grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/
}
if has_src; then
    exit 0
fi
# shellcheck source=scripts/lib/packages.sh
source "$(dirname "$0")/lib/packages.sh"
if [ "$(id -u)" = 0 ] && [ -z "${SQCQ_PACKAGE_LOCK_HELD:-}" ]; then
    # again under the package lock: another script may be adding the
    # entry, or updating the lists, right now
    package_lock "$0" "$@"
    exit
fi
if [ "$(id -u)" != 0 ]; then
    echo "enable-deb-src: no deb-src entry and not root: add one (Types: deb-src) to use source packages" >&2
    exit 1
fi
out=/etc/apt/sources.list.d/sqcq-deb-src.sources
: > "$out.tmp"
for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] && [ "$f" != "$out" ] || continue
    # deb822 stanzas whose Types is deb: the same stanza as deb-src.
    awk 'BEGIN { RS = ""; ORS = "\n\n" }
         /(^|\n)Types:[ \t]*deb([ \t]|\n|$)/ && !/(^|\n)Enabled:[ \t]*no/ {
             sub(/(^|\n)Types:[ \t]*deb/, "&-src"); print }' "$f" >> "$out.tmp"
done
if [ -e /etc/apt/sources.list ]; then
    # One-line format: deb lines become deb-src lines.
    sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list > "${out%.sources}.list.tmp"
    if [ -s "${out%.sources}.list.tmp" ]; then
        mv "${out%.sources}.list.tmp" "${out%.sources}.list"
    else
        rm -f "${out%.sources}.list.tmp"
    fi
fi
if [ -s "$out.tmp" ]; then
    mv "$out.tmp" "$out"
else
    rm -f "$out.tmp"
fi
has_src || { echo "enable-deb-src: found no deb entry to derive a deb-src entry from" >&2; exit 1; }
echo "enable-deb-src: source packages enabled ($out)" >&2
apt-get update -qq
