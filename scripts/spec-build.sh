#!/usr/bin/env bash
# Builds the LaTeX rendition of the spec, docs/spec/tex/virtio-sqcq.tex
# (docs/spec/virtio-sqcq.md in the form of the virtio specification), into
# target/spec/virtio-sqcq.pdf (pdflatex) and target/spec/html/virtio-sqcq.html
# (tex4ht's htlatex), with Debian's TeX packages, installed when missing:
# texlive-latex-base (pdflatex, hyperref, longtable, array),
# texlive-latex-recommended (listings), texlive-fonts-recommended
# (Helvetica and txtt with real underscores, T1) and texlive-plain-generic
# (tex4ht).
#
# It checks first that the rendition says what the Markdown says
# (scripts/spec-sync.py, which the test command runs too), and fails on a
# LaTeX warning (an undefined reference, a label defined twice) or an
# overfull box. Not part of scripts/test.sh: it needs 82 MB of TeX
# packages (a minute to install) and CI checks the sync alone.
#
# Usage: scripts/spec-build.sh [--pdf-only]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/packages.sh
source scripts/lib/packages.sh

pdf_only=false
case "${1:-}" in
"") ;;
--pdf-only) pdf_only=true ;;
*)
    echo "usage: $0 [--pdf-only]" >&2
    exit 2
    ;;
esac

scripts/spec-sync.py

packages=(texlive-latex-base texlive-latex-recommended texlive-fonts-recommended)
$pdf_only || packages+=(texlive-plain-generic)
ensure_packages spec-build "${packages[@]}"

src="$PWD/docs/spec/tex"
out="$PWD/target/spec"
mkdir -p "$out/pdf" "$out/html"
# sqcq-macros.tex is found through TEXINPUTS (the trailing colon keeps
# TeX's own path).
export TEXINPUTS="$src:"

# The first pass writes the labels and the contents, the second uses
# them; a third only if LaTeX still asks for one.
for pass in 1 2 3; do
    if ! pdflatex -interaction=nonstopmode -halt-on-error -output-directory "$out/pdf" \
        "$src/virtio-sqcq.tex" >"$out/pdf/pdflatex.out" 2>&1; then
        tail -n 30 "$out/pdf/pdflatex.out" >&2
        echo "spec-build: pdflatex failed (pass $pass): $out/pdf/virtio-sqcq.log" >&2
        exit 1
    fi
    grep -q "Rerun to get" "$out/pdf/virtio-sqcq.log" || break
done
log="$out/pdf/virtio-sqcq.log"
if grep -E -A3 "^(LaTeX|Package [A-Za-z]+) Warning|^Overfull" "$log" >&2; then
    echo "spec-build: warnings in $log (above)" >&2
    exit 1
fi
cp "$out/pdf/virtio-sqcq.pdf" "$out/virtio-sqcq.pdf"
echo "spec-build: $out/virtio-sqcq.pdf ($(grep -o '([0-9]* pages' "$log" | tr -d '('))"

$pdf_only && exit 0

# tex4ht (htlatex: three latex runs, then tex4ht and t4ht) writes its
# auxiliary files into the current directory: run it in target/spec/html,
# for one XHTML page and its stylesheet.
html="$out/html"
(
    cd "$html"
    if ! htlatex "$src/virtio-sqcq.tex" "xhtml,charset=utf-8" " -cunihtf -utf8" \
        >htlatex.out 2>&1; then
        tail -n 30 htlatex.out >&2
        echo "spec-build: htlatex failed: $html/htlatex.out" >&2
        exit 1
    fi
)
# The last latex run's log; auxhook's notice that tex4ht patched
# \document first is expected.
if grep -E "^(LaTeX|Package [A-Za-z]+) Warning" "$html/virtio-sqcq.log" | grep -v "^Package auxhook" >&2 ||
    grep -E -- "--- (warning|error) ---" "$html/htlatex.out" >&2; then
    echo "spec-build: warnings in $html/virtio-sqcq.log or $html/htlatex.out (above)" >&2
    exit 1
fi
# tex4ht writes the fonts' ligatures as Unicode ligature characters
# (U+FB00-FB04), which a browser's search does not match: spell them out.
sed -i -e 's/\xef\xac\x80/ff/g; s/\xef\xac\x81/fi/g; s/\xef\xac\x82/fl/g' \
    -e 's/\xef\xac\x83/ffi/g; s/\xef\xac\x84/ffl/g' "$html/virtio-sqcq.html"
echo "spec-build: $html/virtio-sqcq.html"
