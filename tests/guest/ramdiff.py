#!/usr/bin/env python3
"""Compares two guest RAM images (QMP pmemsave) page by page, for
tests/guest/live.sh: the source's RAM once the migration completed and the
destination's before it runs (-S).

  ramdiff.py SOURCE DESTINATION [PAGE_SIZE]

Prints one line: "all N pages identical" (exit status 0), or "K of N pages
differ: GPA (bytes differing, first offsets), ..." (exit status 1); exit
status 2 when an image cannot be read or the sizes differ. A differing
page is a write the migration did not carry: by a vCPU (QEMU's dirty
tracking) or by the device (a write the dirty log did not mark).
"""
import sys

BLOCK = 1 << 20
SHOWN = 12


def page_diff(a, b):
    """Bytes that differ between two equal-length pages, and the first few
    offsets where they do."""
    offsets = [i for i in range(len(a)) if a[i] != b[i]]
    return len(offsets), offsets[:4]


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    page = int(argv[3]) if len(argv) > 3 else 4096
    try:
        src, dst = open(argv[1], "rb"), open(argv[2], "rb")
    except OSError as e:
        print("cannot read the images: %s" % e)
        return 2
    with src, dst:
        pages, differ, at = 0, [], 0
        while True:
            a, b = src.read(BLOCK), dst.read(BLOCK)
            if len(a) != len(b):
                print("the images differ in size (%d and %d bytes read at %#x)" % (len(a), len(b), at))
                return 2
            if not a:
                break
            pages += (len(a) + page - 1) // page
            if a != b:
                for off in range(0, len(a), page):
                    pa, pb = a[off:off + page], b[off:off + page]
                    if pa != pb:
                        n, first = page_diff(pa, pb)
                        differ.append("%#x (%d bytes at %s)" % (at + off, n, ",".join("%#x" % o for o in first)))
            at += len(a)
    if not differ:
        print("all %d pages identical" % pages)
        return 0
    more = "" if len(differ) <= SHOWN else ", and %d more" % (len(differ) - SHOWN)
    print("%d of %d pages differ: %s%s" % (len(differ), pages, ", ".join(differ[:SHOWN]), more))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
