# shellcheck shell=bash
# Sourced by the project's scripts: Debian packages installed on demand.

# ensure_packages WHO PKG...: installs those of PKG that are missing (as
# root; otherwise names them and fails), with WHO in the messages. When
# every one is present this costs dpkg queries and nothing else.
ensure_packages() {
    local who="$1" pkg
    shift
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    if [ "$(id -u)" != 0 ]; then
        echo "$who: missing packages ${missing[*]} (run as root, or apt-get install them)" >&2
        return 1
    fi
    echo "$who: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    package_lock apt-get update -qq
    package_lock apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
}

# package_lock CMD...: runs CMD holding the project's package lock
# (/var/lock/sqcq-packages.lock; run within it, CMD runs at once).
# scripts/test.sh runs its guest lane beside the host tests, and both
# install packages (the guest lane what its builds need, the host lane its
# own Debian package): apt and dpkg make a second operation fail rather
# than wait (apt-get update always, dpkg -i always, apt-get install after
# its lock timeout), so they take turns here.
package_lock() {
    if [ -n "${SQCQ_PACKAGE_LOCK_HELD:-}" ]; then
        "$@"
        return
    fi
    (
        flock -w 1800 9 || { echo "package_lock: /var/lock/sqcq-packages.lock held for 30 minutes" >&2; exit 1; }
        export SQCQ_PACKAGE_LOCK_HELD=1
        "$@"
    ) 9>/var/lock/sqcq-packages.lock
}
