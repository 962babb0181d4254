# shellcheck shell=bash
# Sourced by the scripts that use Debian's bookworm-backports suite
# (scripts/qemu-backports.sh, scripts/build-qemu.sh 10.0).

# shellcheck source=scripts/lib/packages.sh
source "$(dirname "${BASH_SOURCE[0]}")/packages.sh"

# enable_backports WHO: adds bookworm-backports, binary and source
# entries, derived from the machine's own apt sources (the same URIs and
# keys; no host is named here), when missing, and refreshes the package
# lists. Backports are never installed by default (apt pins them at 100):
# nothing else on the machine changes.
enable_backports() {
    local who="$1" suite=bookworm-backports
    local list=/etc/apt/sources.list.d/sqcq-backports.sources
    # ours, from this function (an older one without deb-src is redone)
    if grep -qs '^Types: deb deb-src$' "$list"; then return 0; fi
    [ "$(id -u)" = 0 ] || { echo "$who: no $suite entry and not root: add one to use it" >&2; return 1; }
    if [ -z "${SQCQ_PACKAGE_LOCK_HELD:-}" ]; then
        # under the package lock: another script may be updating the lists
        package_lock enable_backports "$who"
        return
    fi
    : > "$list.tmp"
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] && [ "$f" != "$list" ] || continue
        # the deb stanza of bookworm itself, for bookworm-backports
        awk -v s="$suite" 'BEGIN { RS = ""; ORS = "\n\n" }
             /(^|\n)Types:[ \t]*deb([ \t]|\n|$)/ && /(^|\n)Suites:[^\n]*[ \t]bookworm([ \t]|\n|$)/ &&
             !/(^|\n)Enabled:[ \t]*no/ { sub(/(^|\n)Suites:[^\n]*/, "\nSuites: " s);
                                        sub(/(^|\n)Types:[^\n]*/, "\nTypes: deb deb-src"); print }' "$f" >> "$list.tmp"
    done
    if [ -s "$list.tmp" ]; then mv "$list.tmp" "$list"; else rm -f "$list.tmp"; fi
    [ -s "$list" ] || { echo "$who: found no bookworm deb entry to derive $suite from" >&2; return 1; }
    echo "$who: $suite enabled ($list)" >&2
    apt-get update -qq
}

# backports_version PACKAGE: the version of PACKAGE in bookworm-backports
backports_version() {
    apt-cache madison "$1" | awk '$0 ~ "bookworm-backports/" { print $3; exit }'
}
