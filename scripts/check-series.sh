#!/usr/bin/env bash
# Checks that every patch of a Linux series builds on its own, as the
# kernel's maintainers ask ("each patch building on its own"): the series
# is applied one patch at a time to the Debian source of the series'
# kernel (as scripts/build-guest-modules.sh fetches it), and after each the
# files the series touches are compiled, with no warning allowed.
#
#   6.1   the virtio modules out of tree against linux-headers, as the
#         guest's are built (tests/guest/kmod/Kbuild)
#   6.12  the series' objects out of tree against linux-headers, each on
#         its own (Debian builds the virtio core into this kernel), as
#         scripts/build-guest-modules.sh checks the whole series
# Both with Debian's own configuration of that kernel
# (scripts/lib/guest-kernel.sh, guest_flat_build).
#
#   scripts/check-series.sh [SERIES]     SERIES: 6.1 (default) or 6.12
#
# Not part of scripts/test.sh (the guest suite builds and runs the whole
# series for both kernels); run it when a patch of a series changes.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
source scripts/lib/packages.sh
# shellcheck source=scripts/lib/guest-kernel.sh
source scripts/lib/guest-kernel.sh
log() { echo "check-series: $*" >&2; }

series="${1:-6.1}"
SQCQ_GUEST_KERNEL="$series" guest_series > /dev/null
ensure_packages check-series "$(guest_image_package "$series")" make gcc xz-utils
kver="$(guest_kver "$series")"
[ -n "$kver" ] || { log "no $series kernel installed"; exit 1; }
ensure_packages check-series "linux-headers-$kver"
version="$(dpkg-query -W -f='${Version}' "linux-image-$kver" 2>/dev/null ||
           dpkg-query -W -f='${Version}' "linux-image-$kver-unsigned")"
patches=()
for p in patches/linux/"$series"/0*.patch; do
    case "$p" in */0000-*) ;; *) [ -e "$p" ] && patches+=("$p") ;; esac
done

work="$(mktemp -d "${TMPDIR:-/tmp}/sqcq-series.XXXXXX")"
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq "linux-source-$series=$version" >/dev/null 2>&1)
src="$work/linux"
mkdir -p "$src"
dpkg-deb --fsys-tarfile "$work"/linux-source-*.deb | tar -x -C "$work" --wildcards './usr/src/linux-source-*.tar.xz'
tar -xJf "$work"/usr/src/linux-source-*.tar.xz -C "$src" --strip-components=1
touched="$(sed -n 's|^+++ b/||p' "${patches[@]}" | sort -u)"

build_step() { # LOG: compiles the series' files as they are now
    guest_flat_build "$series" "$src" "$kver" "$work/build" "$touched" > "$1" 2>&1
}
log "the base ($kver, linux-source-$series $version)"
build_step "$work/step0.log" || { tail -n 30 "$work/step0.log" >&2; log "the base does not build"; exit 1; }
n=0 bad=0
for p in "${patches[@]}"; do
    n=$((n + 1))
    (cd "$src" && patch -p1 --quiet --forward < "$repo/$p") || { log "$(basename "$p") does not apply"; exit 1; }
    if ! build_step "$work/step$n.log"; then
        grep -E "error" "$work/step$n.log" | head -n 10 >&2
        log "FAIL $(basename "$p"): does not build"
        bad=$((bad + 1))
    # (only the series' files are compiled, laid out flat: every warning
    # is one of theirs or of the headers they include)
    elif grep -E "warning:" "$work/step$n.log" >&2; then
        log "FAIL $(basename "$p"): builds with warnings"
        bad=$((bad + 1))
    else
        log "ok   $(basename "$p")"
    fi
done
[ "$bad" = 0 ] || { log "$bad of $n patches do not build cleanly on their own"; exit 1; }
log "each of the $n patches of patches/linux/$series builds on its own, without warnings"
