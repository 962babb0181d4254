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
    apt-get update -qq
    apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
}
