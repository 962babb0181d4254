#!/usr/bin/env python3
"""Keeps docs/spec/tex/virtio-sqcq.tex in sync with docs/spec/virtio-sqcq.md.

The Markdown file is the spec; the LaTeX file renders it in the form of the
virtio specification. Both are split into the same units: headings (number
and title), paragraphs, list items, table rows and code blocks, each placed
in the section whose number it appears under. Markup is normalised away on
both sides (Markdown code spans, emphasis and links; LaTeX macros, quotes,
dashes, ties, `\\ref` resolved to the number of the section it points to),
so that only wording counts. The check fails when:

- a normative statement (a unit that holds an RFC 2119 key word in
  capitals: MUST, SHOULD, MAY, ...) is in one file and not in the other,
  or differs in wording, or sits in another section;
- any other unit (prose, table row, code block) differs the same way, or
  two units of a section come in another order;
- a heading differs, or is missing on one side (the LaTeX file may add its
  Conformance section, and nothing else);
- a rule id (T1, D1, S1, R1, I1, the steps P1 and C1, fence 1, ...) is
  mentioned a different number of times in a section, or defined (`**T1.**`
  against `\\ruleid{T1}`) in another section;
- a "Driver Requirements:" or "Device Requirements:" section of the
  Markdown file is not a normative subsection (`\\drivernormative`,
  `\\devicenormative`) of the same role in the LaTeX file;
- a normative subsection is not referenced from its conformance clause
  ("Driver Conformance" or "Device Conformance"), or a section holding a
  normative statement outside a normative subsection is referenced from
  neither; or a `\\ref` names a label that does not exist.

Each mismatch is printed with its file, line and section, and both texts.
`--self-test` runs built-in cases that must each be caught.

Reads the two files only (no TeX needed); well under a second.
"""

import argparse
import bisect
import difflib
import itertools
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MD_PATH = ROOT / "docs/spec/virtio-sqcq.md"
TEX_PATH = ROOT / "docs/spec/tex/virtio-sqcq.tex"

# RFC 2119 key words, in capitals, as whole words (NEED_WAKEUP is not MAY).
KEYWORD = re.compile(r"(?<![\w-])(MUST|SHALL|SHOULD|MAY|REQUIRED|RECOMMENDED|OPTIONAL)(?![\w-])")
RULE_ID = re.compile(r"(?<![\w.])([TDSRIPC][1-9])(?![\w])")
FENCES = re.compile(r"\bfences?\s+(\d+(?:\s*(?:,|and|to|or)\s*\d+)*)")
ROLES = {"Driver": "drivernormative", "Device": "devicenormative"}


SEQ = itertools.count()


class Unit:
    """One paragraph, list item, table row or code block."""

    def __init__(self, kind, section, line, text, raw=""):
        self.kind = kind  # "text", "row" or "code"
        self.section = section  # "0" before the first section
        self.line = line
        self.text = text  # normalised
        self.raw = raw
        self.seq = next(SEQ)  # reading order, for the order check

    @property
    def normative(self):
        return self.kind == "text" and bool(KEYWORD.search(self.text))


class Doc:
    def __init__(self, name):
        self.name = name
        self.title = ""
        self.headings = []  # (number, title, line, role or None, label)
        self.units = []
        self.definitions = {}  # rule id -> (section, line)
        self.labels = {}  # label -> section number
        self.refs = []  # (label, line)


def squash(text):
    text = re.sub(r"\s+", " ", text).strip()
    # Dashes: "a - b", "a -- b" and "a--b" are the same words.
    text = re.sub(r"\s*[\u2013\u2014]\s*", " - ", text)
    text = text.replace("\u201c", '"').replace("\u201d", '"')
    text = text.replace("\u2018", "'").replace("\u2019", "'")
    return text


# --- Markdown -------------------------------------------------------------


def md_inline(text):
    """Markdown inline markup to plain words."""
    spans = []

    def keep(m):
        spans.append(m.group(1))
        return "\0%d\0" % (len(spans) - 1)

    text = re.sub(r"`([^`]*)`", keep, text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\\([\\`*_{}\[\]()#+\-.!|])", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])", r"\1", text)
    text = re.sub(r"\0(\d+)\0", lambda m: spans[int(m.group(1))], text)
    text = re.sub(r"\s+-\s+", " - ", text)
    return squash(text)


MD_ITEM = re.compile(r"^(\s*)(- |\d+\. |[a-z]\) )(.*)$")
MD_HEADING = re.compile(r"^(#+)\s+(.*?)\s*$")
MD_NUMBERED = re.compile(r"^(\d+(?:\.\d+)*)\.?\s+(.*)$")


def parse_md(source, name="md"):
    doc = Doc(name)
    lines = source.split("\n")
    section = "0"
    para = None  # [first line number, [lines]]
    lists = []  # [marker indent, content indent]
    i = 0

    def flush():
        nonlocal para
        if para is None:
            return
        first, body = para
        raw = " ".join(body)
        m = re.match(r"\*\*([A-Z][1-9])\.\*\*", raw)
        if m:
            doc.definitions[m.group(1)] = (section, first)
        doc.units.append(Unit("text", section, first, md_inline(raw), raw))
        para = None

    while i < len(lines):
        line = lines[i]
        n = i + 1
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            indent = len(line) - len(line.lstrip())
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i][indent:].rstrip())
                i += 1
            doc.units.append(Unit("code", section, n, "\n".join(body)))
            i += 1
            continue
        heading = MD_HEADING.match(line)
        if heading:
            flush()
            lists = []
            level, title = len(heading.group(1)), heading.group(2)
            if level == 1:
                doc.title = md_inline(title)
            else:
                m = MD_NUMBERED.match(title)
                number, title = (m.group(1), m.group(2)) if m else ("?", title)
                section = number
                role = None
                r = re.match(r"(Driver|Device) Requirements:\s*(.*)$", title)
                if r:
                    role = ROLES[r.group(1)]
                doc.headings.append((number, md_inline(title), n, role, None))
            i += 1
            continue
        if stripped.startswith("|"):
            flush()
            lists = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                row = lines[i].strip().strip("|")
                if not re.fullmatch(r"[\s|:-]+", row):
                    cells = [md_inline(c) for c in row.split("|")]
                    doc.units.append(Unit("row", section, i + 1, " | ".join(cells)))
                i += 1
            continue
        if not stripped:
            flush()
            i += 1
            continue
        item = MD_ITEM.match(line)
        if item and (item.group(2)[0] not in "abcdefghijklmnopqrstuvwxyz" or not item.group(1)):
            flush()
            indent = len(item.group(1))
            while lists and lists[-1][0] > indent:
                lists.pop()
            if not lists or lists[-1][0] < indent:
                lists.append([indent, indent + len(item.group(2))])
            marker = item.group(2).strip()
            text = item.group(3)
            if marker[0].isalpha():
                text = marker + " " + text  # "a)" is part of the words
            para = [n, [text]]
            i += 1
            continue
        if stripped.startswith(": ") and para is not None:
            para[1].append(stripped[2:])  # definition list
            i += 1
            continue
        if para is not None:
            para[1].append(stripped)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        while lists and lists[-1][1] > indent:
            lists.pop()
        para = [n, [stripped]]
        i += 1
    flush()
    return doc


# --- LaTeX ----------------------------------------------------------------

TEX_SECTION = re.compile(r"^\\(section|subsection|subsubsection)\*?\{(.*)\}\s*$")
TEX_NORMATIVE = re.compile(
    r"^\\(drivernormative|devicenormative)\{\\(section|subsection|subsubsection)\}"
    r"\{(.*)\}\{(.*)\}\s*$"
)
LEVELS = {"section": 1, "subsection": 2, "subsubsection": 3}
ROLE_TITLE = {
    "drivernormative": "Driver Requirements: ",
    "devicenormative": "Device Requirements: ",
}
VERBATIM = ("lstlisting", "verbatim")
TABLES = ("longtable", "tabular", "tabularx")


def brace_arg(text, start):
    """The group opening at text[start] == '{': (contents, index after it)."""
    depth = 0
    for j in range(start, len(text)):
        c = text[j]
        if c == "\\":
            continue
        if c == "{" and (j == 0 or text[j - 1] != "\\"):
            depth += 1
        elif c == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1 : j], j + 1
    return text[start + 1 :], len(text)


TEX_ESCAPES = {
    "\\_": "_",
    "\\&": "&",
    "\\#": "#",
    "\\%": "%",
    "\\{": "{",
    "\\}": "}",
    "\\$": "$",
    "\\textasciitilde": "~",
    "\\textbackslash": "\\",
    "\\textless": "<",
    "\\textgreater": ">",
    "\\textasciicircum": "^",
    "\\textmu": "\u00b5",
}
DROP_WITH_ARG = ("label", "index", "hypertarget", "vspace", "hspace", "phantomsection")


def tex_inline(text, labels, refs=None, line=0):
    """LaTeX to plain words: macros unwrapped, \\ref resolved."""
    text = re.sub(r"\$\\mu\$", "\u00b5", text)
    text = re.sub(r"\$([^$]*)\$", r"\1", text)
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            m = re.match(r"\\([A-Za-z@]+)\*?|\\(.)", text[i:])
            name = m.group(1) or m.group(2)
            whole = m.group(0)
            esc = TEX_ESCAPES.get("\\" + name)
            if esc is not None:
                out.append(esc)
                i += len(whole)
                if m.group(1) and i < len(text) and text[i] == "{" and text[i + 1 : i + 2] == "}":
                    i += 2
                continue
            if m.group(2) is not None:
                # \\ line break, \, thin space, \  control space, \- hyphen
                # point, \@ spacing hint, \/ italic correction.
                out.append(" " if name in "\\, ;:!" else "")
                i += len(whole)
                continue
            i += len(whole)
            while i < len(text) and text[i] == "[":
                close = text.find("]", i)
                i = close + 1 if close >= 0 else len(text)
            if name in ("ref", "pageref", "nameref"):
                if i < len(text) and text[i] == "{":
                    label, i = brace_arg(text, i)
                    if refs is not None:
                        refs.append((label, line))
                    out.append(labels.get(label, "??" + label))
                continue
            if name == "ruleid":
                arg, i = brace_arg(text, i)
                out.append(arg + ".")
                continue
            if name == "href":
                _, i = brace_arg(text, i)
                continue
            if name in DROP_WITH_ARG:
                if i < len(text) and text[i] == "{":
                    _, i = brace_arg(text, i)
                continue
            if m.group(1) and i < len(text) and text[i] == " ":
                i += 1  # a control word eats the space after it
            continue
        if c in "{}":
            i += 1
            continue
        if c == "~":
            out.append(" ")
            i += 1
            continue
        if c == "%":
            nl = text.find("\n", i)
            i = nl if nl >= 0 else len(text)
            continue
        out.append(c)
        i += 1
    text = "".join(out)
    text = text.replace("``", '"').replace("''", '"')
    text = re.sub(r"-{2,3}", "-", text)
    text = re.sub(r"\s+-\s+", " - ", text)
    return squash(text)


def strip_comment(line):
    m = re.search(r"(?<!\\)%", line)
    return line if m is None else line[: m.start()]


def parse_tex(source, name="tex"):
    doc = Doc(name)
    lines = source.split("\n")
    m = re.search(r"\\title\{", source)
    if m:
        doc.title = brace_arg(source, m.end() - 1)[0]
    try:
        start = next(k for k, l in enumerate(lines) if l.strip().startswith("\\begin{document}"))
    except StopIteration:
        start = 0
    # First pass: section numbers and labels, so that \ref resolves.
    counters = [0, 0, 0]
    number = "0"
    entries = []  # (line index, number, title, role, key)
    for k in range(start, len(lines)):
        l = strip_comment(lines[k]).strip()
        s, nm = TEX_SECTION.match(l), TEX_NORMATIVE.match(l)
        if s or nm:
            level = LEVELS[s.group(1) if s else nm.group(2)]
            counters[level - 1] += 1
            for j in range(level, 3):
                counters[j] = 0
            number = ".".join(str(c) for c in counters[:level])
            title = s.group(2) if s else nm.group(3)
            role = nm.group(1) if nm else None
            entries.append((k, number, title, role))
            if nm:
                doc.labels[nm.group(1) + ":" + nm.group(4)] = number
        for lab in re.findall(r"\\label\{([^}]*)\}", l):
            doc.labels[lab] = number
    heads = {e[0]: e for e in entries}

    section = "0"
    buf = None  # [first line, [lines]]

    def flush():
        nonlocal buf
        if buf is None:
            return
        first, body = buf
        raw = "\n".join(body)
        for rid in re.findall(r"\\ruleid\{([A-Z][1-9])\}", raw):
            doc.definitions[rid] = (section, first)
        text = tex_inline(raw, doc.labels, doc.refs, first)
        if text:
            doc.units.append(Unit("text", section, first, text, raw))
        buf = None

    k = start + 1
    while k < len(lines):
        raw_line = lines[k]
        n = k + 1
        env = re.match(r"^\s*\\begin\{(\w+)\}", raw_line)
        if env and env.group(1) in VERBATIM:
            flush()
            body = []
            k += 1
            while k < len(lines) and not re.match(r"^\s*\\end\{%s\}" % env.group(1), lines[k]):
                body.append(lines[k].rstrip())
                k += 1
            doc.units.append(Unit("code", section, n, "\n".join(body)))
            k += 1
            continue
        line = strip_comment(raw_line)
        if not line.strip() and raw_line.strip():
            k += 1  # a comment line is not a paragraph break
            continue
        if env and env.group(1) in TABLES:
            flush()
            body = []
            k += 1
            while k < len(lines) and not re.match(r"^\s*\\end\{%s\}" % env.group(1), lines[k]):
                body.append((k + 1, strip_comment(lines[k])))
                k += 1
            k += 1
            add_rows(doc, section, body)
            continue
        if k in heads:
            flush()
            _, number, title, role = heads[k]
            section = number
            full = ROLE_TITLE.get(role, "") + tex_inline(title, doc.labels)
            doc.headings.append((number, full, n, role, None))
            k += 1
            continue
        if line.strip().startswith("\\end{document}"):
            break
        stripped = line.strip()
        if not stripped or re.match(r"^\\(begin|end)\{", stripped):
            flush()
            rest = re.sub(r"^\\(begin|end)\{\w+\}(\[[^\]]*\]|\{[^}]*\})*", "", stripped).strip()
            if rest:
                buf = [n, [rest]]
            k += 1
            continue
        if stripped.startswith("\\item"):
            flush()
            rest = stripped[len("\\item") :]
            if rest.startswith("["):
                close = rest.index("]")
                rest = rest[1:close] + " " + rest[close + 1 :]
            buf = [n, [rest]]
            k += 1
            continue
        if buf is None:
            buf = [n, [line]]
        else:
            buf[1].append(line)
        k += 1
    flush()
    return doc


def add_rows(doc, section, body):
    text = "\n".join(l for _, l in body)
    first = body[0][0] if body else 0
    # Rows end with \\; the head of a longtable repeats nothing we keep.
    text = re.sub(
        r"\\(hline|toprule|midrule|bottomrule|endhead|endfirsthead|endfoot|endlastfoot)\b", "", text
    )
    text = re.sub(r"\\caption\{[^}]*\}", "", text)
    offset = 0
    for row in re.split(r"\\\\(?:\[[^\]]*\])?", text):
        line = first + text[: offset + len(row) - len(row.lstrip())].count("\n")
        offset += len(row) + 2
        if not row.strip():
            continue
        cells = re.split(r"(?<!\\)&", row)
        cells = [tex_inline(c, doc.labels, doc.refs, line) for c in cells]
        doc.units.append(Unit("row", section, line, " | ".join(cells)))


# --- comparison -----------------------------------------------------------


class Report:
    def __init__(self, md_name, tex_name):
        self.md_name, self.tex_name = md_name, tex_name
        self.problems = []  # (category, message)

    def add(self, category, message):
        self.problems.append((category, message))

    def categories(self):
        return {c for c, _ in self.problems}


def rule_ids(text):
    ids = [m.group(1) for m in RULE_ID.finditer(text)]
    for m in FENCES.finditer(text):
        ids += ["fence " + d for d in re.findall(r"\d+", m.group(1))]
    return ids


def word_diff(a, b):
    wa, wb = a.split(), b.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb).get_opcodes():
        if op != "equal":
            out.append("%s [%s] -> [%s]" % (op, " ".join(wa[i1:i2]), " ".join(wb[j1:j2])))
    return "; ".join(out)


def describe(unit):
    if unit.normative:
        return "normative statement"
    return {"text": "paragraph", "row": "table row", "code": "code block"}[unit.kind]


def out_of_order(pairs):
    """The pairs outside a longest subsequence in the order of the tex."""
    tails, tail_at, prev = [], [], [None] * len(pairs)
    for i, (_, t) in enumerate(pairs):
        k = bisect.bisect_left(tails, t.seq)
        if k == len(tails):
            tails.append(t.seq)
            tail_at.append(i)
        else:
            tails[k] = t.seq
            tail_at[k] = i
        prev[i] = tail_at[k - 1] if k else None
    keep = set()
    i = tail_at[-1] if tail_at else None
    while i is not None:
        keep.add(i)
        i = prev[i]
    return [p for i, p in enumerate(pairs) if i not in keep]


def compare_units(md, tex, rep, conformance):
    tex_units = [u for u in tex.units if u.section not in conformance]
    pending_tex = {}
    for u in tex_units:
        pending_tex.setdefault((u.kind, u.section, u.text), []).append(u)
    left_md = []
    matched = []  # (md unit, tex unit), in the order of the md
    for u in md.units:
        bucket = pending_tex.get((u.kind, u.section, u.text))
        if bucket:
            matched.append((u, bucket.pop(0)))
        else:
            left_md.append(u)
    # Units present on both sides but in another order: those outside the
    # longest run that both files have in the same order.
    for u, t in out_of_order(matched):
        rep.add(
            "order",
            "%s in another place of section %s: %s:%d, %s:%d\n    %s"
            % (describe(u), u.section, rep.md_name, u.line, rep.tex_name, t.line, u.text),
        )
    left_tex = [u for b in pending_tex.values() for u in b]
    left_tex.sort(key=lambda u: u.line)
    for u in left_md:
        best, score = None, 0.0
        for t in left_tex:
            if t.kind != u.kind:
                continue
            r = difflib.SequenceMatcher(None, u.text, t.text).ratio()
            if t.section != u.section:
                r -= 0.2 if t.text != u.text else 0.0
            if r > score:
                best, score = t, r
        category = "normative" if u.normative or (best and best.normative) else u.kind
        where = "%s:%d [section %s]" % (rep.md_name, u.line, u.section)
        if best is not None and score >= 0.6:
            left_tex.remove(best)
            there = "%s:%d [section %s]" % (rep.tex_name, best.line, best.section)
            if best.text == u.text:
                rep.add(
                    category,
                    "%s in another section: %s, %s\n    %s" % (describe(u), where, there, u.text),
                )
            else:
                rep.add(
                    category,
                    "%s differs: %s, %s\n    md:  %s\n    tex: %s\n    diff: %s"
                    % (describe(u), where, there, u.text, best.text, word_diff(u.text, best.text)),
                )
        else:
            rep.add(
                category,
                "%s missing from %s: %s\n    md:  %s" % (describe(u), rep.tex_name, where, u.text),
            )
    for t in left_tex:
        category = "normative" if t.normative else t.kind
        rep.add(
            category,
            "%s missing from %s: %s:%d [section %s]\n    tex: %s"
            % (describe(t), rep.md_name, rep.tex_name, t.line, t.section, t.text),
        )


def compare_ids(md, tex, rep, conformance):
    counts = {}
    for side, doc in ((0, md), (1, tex)):
        for u in doc.units:
            if u.section in conformance:
                continue
            for rid in rule_ids(u.text):
                counts.setdefault((u.section, rid), [0, 0, [], []])
                c = counts[(u.section, rid)]
                c[side] += 1
                c[2 + side].append(u.line)
    for (section, rid), (a, b, la, lb) in sorted(counts.items()):
        if a != b:
            rep.add(
                "rule-id",
                "rule id %s in section %s: %d mention(s) in %s (lines %s), %d in %s (lines %s)"
                % (rid, section, a, rep.md_name, la or "-", b, rep.tex_name, lb or "-"),
            )
    for rid in sorted(set(md.definitions) | set(tex.definitions)):
        a, b = md.definitions.get(rid), tex.definitions.get(rid)
        if a is None or b is None or a[0] != b[0]:
            rep.add(
                "rule-id",
                "rule id %s defined in %s in %s, in %s in %s"
                % (
                    rid,
                    rep.md_name,
                    "section %s (line %d)" % a if a else "no section",
                    rep.tex_name,
                    "section %s (line %d)" % b if b else "no section",
                ),
            )


def compare_headings(md, tex, rep, conformance):
    if md.title != tex_inline(tex.title, tex.labels):
        rep.add(
            "heading",
            "title differs:\n    md:  %s\n    tex: %s"
            % (md.title, tex_inline(tex.title, tex.labels)),
        )
    texh = {h[0]: h for h in tex.headings if h[0] not in conformance}
    for number, title, line, role, _ in md.headings:
        t = texh.pop(number, None)
        if t is None:
            rep.add(
                "heading",
                "section %s %r (%s:%d) missing from %s"
                % (number, title, rep.md_name, line, rep.tex_name),
            )
            if role:
                rep.add(
                    "requirements",
                    "%s:%d: %s %s has no normative subsection in %s"
                    % (rep.md_name, line, number, title, rep.tex_name),
                )
            continue
        if t[1] != title:
            rep.add(
                "heading",
                "section %s title differs: %s:%d, %s:%d\n    md:  %s\n    tex: %s"
                % (number, rep.md_name, line, rep.tex_name, t[2], title, t[1]),
            )
        if role and t[3] != role:
            rep.add(
                "requirements",
                "%s:%d: %s %s is not a \\%s subsection in %s (line %d)"
                % (rep.md_name, line, number, title, role, rep.tex_name, t[2]),
            )
        if not role and t[3]:
            rep.add(
                "requirements",
                "%s:%d: section %s is normative (\\%s) but %s has no Requirements section there"
                % (rep.tex_name, t[2], number, t[3], rep.md_name),
            )
    for number, title, line, _, _ in texh.values():
        rep.add(
            "heading",
            "section %s %r (%s:%d) missing from %s"
            % (number, title, rep.tex_name, line, rep.md_name),
        )


def conformance_sections(tex):
    """Section numbers of the Conformance section and below it."""
    top = [h for h in tex.headings if h[1] == "Conformance" and "." not in h[0]]
    if not top:
        return set(), None
    number = top[0][0]
    return {h[0] for h in tex.headings if h[0] == number or h[0].startswith(number + ".")}, number


def check_conformance(tex, rep, conf, conf_number):
    if conf_number is None:
        rep.add("conformance", "%s has no Conformance section" % rep.tex_name)
        return
    clauses = {}
    for number, title, line, _, _ in tex.headings:
        if number in conf:
            for role, word in (("drivernormative", "Driver"), ("devicenormative", "Device")):
                if title == word + " Conformance":
                    clauses[role] = number
    refs_in = {}
    for label, line in tex.refs:
        refs_in.setdefault(section_of_line(tex, line), set()).add(label)
    for label, line in tex.refs:
        if label not in tex.labels:
            rep.add("reference", "%s:%d: \\ref{%s} names no label" % (rep.tex_name, line, label))
    listed = set()
    for role in ("drivernormative", "devicenormative"):
        number = clauses.get(role)
        if number is None:
            rep.add(
                "conformance",
                "%s has no %s Conformance clause" % (rep.tex_name, role[:6].capitalize()),
            )
            continue
        inside = set()
        for sec, labels in refs_in.items():
            if sec == number or sec.startswith(number + "."):
                inside |= labels
        listed |= inside
        other = "devicenormative" if role == "drivernormative" else "drivernormative"
        for label in sorted(tex.labels):
            if label.startswith(role + ":") and label not in inside:
                rep.add(
                    "conformance",
                    "normative subsection %s (%s) is not listed in the %s Conformance clause (section %s)"
                    % (tex.labels[label], label, role[:6].capitalize(), number),
                )
            if label.startswith(other + ":") and label in inside:
                rep.add(
                    "conformance",
                    "%s is listed in the %s Conformance clause" % (label, role[:6].capitalize()),
                )
    normative_secs = {h[0] for h in tex.headings if h[3]}
    by_number = {}
    for label, number in tex.labels.items():
        by_number.setdefault(number, set()).add(label)
    for u in tex.units:
        if u.section in conf or not u.normative or u.section == "0":
            continue
        sec = u.section
        inside_normative = any(sec == s or sec.startswith(s + ".") for s in normative_secs)
        if inside_normative:
            continue
        covering = set()
        parts = sec.split(".")
        for depth in range(1, len(parts) + 1):
            covering |= by_number.get(".".join(parts[:depth]), set())
        if not covering & listed:
            rep.add(
                "conformance",
                "%s:%d: section %s holds a normative statement outside a normative subsection, and no conformance clause references it"
                % (rep.tex_name, u.line, sec),
            )


def section_of_line(tex, line):
    sec = "0"
    for number, _, hline, _, _ in tex.headings:
        if hline <= line:
            sec = number
    return sec


def check(md_source, tex_source, md_name="md", tex_name="tex"):
    md = parse_md(md_source, md_name)
    tex = parse_tex(tex_source, tex_name)
    rep = Report(md_name, tex_name)
    conf, conf_number = conformance_sections(tex)
    compare_headings(md, tex, rep, conf)
    compare_units(md, tex, rep, conf)
    compare_ids(md, tex, rep, conf)
    check_conformance(tex, rep, conf, conf_number)
    return rep, md, tex


# --- self-test ------------------------------------------------------------

SELF_MD = """\
# A feature: doorbells

*Draft.*

The key words MUST and MAY are used as in the VIRTIO specification.

## 1. Overview (non-normative)

A doorbell is one cache line. See section 2.1.

## 2. The flag

| bit | name |
|---|---|
| 0 | `NEED_WAKEUP` |

```c
struct x { le16 idx; };
```

### 2.1 Device Requirements: The flag

If the feature has been negotiated, the device:

- **T1.** MUST write "both bits" in one store, then fence 1.
- **T2.** MAY clear THROTTLE; see T1 and section 1.

### 2.2 Driver Requirements: The flag

The driver MUST NOT write `sq.flags` (P3 before P5).

## 3. Not negotiated

The device MUST NOT read the doorbells.
"""

SELF_TEX = r"""\documentclass{article}
\input{sqcq-macros}
\title{A feature: doorbells}
\begin{document}
\maketitle

\emph{Draft.}

The key words MUST and MAY are used as in the VIRTIO specification.

\section{Overview (non-normative)}\label{sec:overview}

A doorbell is one cache line. % a comment
See section~\ref{devicenormative:flag}.

\section{The flag}\label{sec:flag}

\begin{longtable}{ll}
bit & name \\ \hline
0 & \field{NEED\_WAKEUP} \\
\end{longtable}

\begin{lstlisting}
struct x { le16 idx; };
\end{lstlisting}

\devicenormative{\subsection}{The flag}{flag}

If the feature has been negotiated, the device:

\begin{itemize}
\item \ruleid{T1} MUST write ``both bits'' in one store, then fence~1.
\item \ruleid{T2} MAY clear THROTTLE; see T1 and
  section~\ref{sec:overview}.
\end{itemize}

\drivernormative{\subsection}{The flag}{flag}

The driver MUST NOT write \field{sq.flags} (P3 before P5).

\section{Not negotiated}\label{sec:not-negotiated}

The device MUST NOT read the doorbells.

\section{Conformance}\label{sec:conformance}

\subsection{Driver Conformance}

A driver MUST conform to:
\begin{itemize}
\item \ref{drivernormative:flag}
\end{itemize}

\subsection{Device Conformance}

A device MUST conform to:
\begin{itemize}
\item \ref{devicenormative:flag}
\item \ref{sec:not-negotiated}
\end{itemize}

\end{document}
"""


def self_test():
    cases = [
        ("the two files agree", None, None, set()),
        (
            "a changed word in a MUST statement of the tex",
            None,
            ("MUST write ``both", "MUST send ``both"),
            {"normative"},
        ),
        (
            "a changed word in a MUST statement of the md",
            ("MUST NOT write", "SHOULD NOT write"),
            None,
            {"normative"},
        ),
        (
            "a normative statement dropped from the tex",
            None,
            ("The device MUST NOT read the doorbells.\n", ""),
            {"normative"},
        ),
        (
            "a rule id dropped from the tex",
            None,
            ("see T1 and", "see it and"),
            {"rule-id"},
        ),
        (
            "a rule id definition dropped from the tex",
            None,
            (r"\item \ruleid{T2} MAY", r"\item T2. MAY"),
            {"rule-id"},
        ),
        (
            "a fence number changed in the tex",
            None,
            ("fence~1", "fence~2"),
            {"rule-id"},
        ),
        (
            "a normative subsection missing from the conformance clauses",
            None,
            ("\\item \\ref{drivernormative:flag}\n", ""),
            {"conformance"},
        ),
        (
            "a normative section outside Requirements not referenced by a clause",
            None,
            ("\\item \\ref{sec:not-negotiated}\n", ""),
            {"conformance"},
        ),
        (
            "a Requirements section rendered as a plain subsection",
            None,
            (
                "\\drivernormative{\\subsection}{The flag}{flag}",
                "\\subsection{Driver Requirements: The flag}",
            ),
            {"requirements"},
        ),
        (
            "a reference that points to another section",
            None,
            ("section~\\ref{sec:overview}", "section~\\ref{sec:flag}"),
            {"normative"},
        ),
        (
            "a table cell changed",
            None,
            ("0 & \\field{NEED\\_WAKEUP}", "1 & \\field{NEED\\_WAKEUP}"),
            {"row"},
        ),
        (
            "a code block changed",
            ("le16 idx;", "le32 idx;"),
            None,
            {"code"},
        ),
        (
            "two list items swapped in the tex",
            None,
            (
                "\\item \\ruleid{T1} MUST write ``both bits'' in one store, then fence~1.\n"
                "\\item \\ruleid{T2} MAY clear THROTTLE; see T1 and\n"
                "  section~\\ref{sec:overview}.\n",
                "\\item \\ruleid{T2} MAY clear THROTTLE; see T1 and\n"
                "  section~\\ref{sec:overview}.\n"
                "\\item \\ruleid{T1} MUST write ``both bits'' in one store, then fence~1.\n",
            ),
            {"order"},
        ),
        (
            "a heading changed",
            ("## 3. Not negotiated", "## 3. When not negotiated"),
            None,
            {"heading"},
        ),
    ]
    failed = 0
    for name, md_edit, tex_edit, expected in cases:
        md, tex = SELF_MD, SELF_TEX
        for edit, which in ((md_edit, "md"), (tex_edit, "tex")):
            if edit is None:
                continue
            src = md if which == "md" else tex
            assert edit[0] in src, (name, edit[0])
            src = src.replace(edit[0], edit[1], 1)
            if which == "md":
                md = src
            else:
                tex = src
        rep, _, _ = check(md, tex, "self.md", "self.tex")
        got = rep.categories()
        ok = (not got) if not expected else (expected <= got)
        print("%s: %s" % ("ok  " if ok else "FAIL", name))
        if not ok:
            failed += 1
            print(
                "    expected %s, got %s"
                % (sorted(expected) or "no mismatch", sorted(got) or "no mismatch")
            )
            for _, message in rep.problems:
                print("    " + message.replace("\n", "\n    "))
    print("%d passed, %d failed" % (len(cases) - failed, failed))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true", help="run the built-in cases")
    parser.add_argument("--md", type=Path, default=MD_PATH)
    parser.add_argument("--tex", type=Path, default=TEX_PATH)
    args = parser.parse_args()
    if args.self_test:
        return self_test()

    def name(p):
        try:
            return str(p.resolve().relative_to(ROOT))
        except ValueError:
            return str(p)

    rep, md, tex = check(args.md.read_text(), args.tex.read_text(), name(args.md), name(args.tex))
    normative = sum(1 for u in md.units if u.normative)
    if rep.problems:
        for category, message in rep.problems:
            print("%s: %s" % (category, message))
        print(
            "spec-sync: %d mismatch(es) between %s and %s"
            % (len(rep.problems), name(args.md), name(args.tex)),
        )
        return 1
    print(
        "spec-sync: %s and %s agree: %d headings, %d units (%d normative), %d rule ids defined, %d normative subsections in the conformance clauses"
        % (
            name(args.md),
            name(args.tex),
            len(md.headings),
            len(md.units),
            normative,
            len(md.definitions),
            sum(1 for h in tex.headings if h[3]),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
