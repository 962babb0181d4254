#!/usr/bin/env python3
"""Import cycles between the modules of each crate of the workspace.

Reads the sources only (no build, a second or two): from each crate root
(src/lib.rs, src/main.rs, src/bin/*.rs, tests/*.rs, benches/*.rs,
examples/*.rs, fuzz/fuzz_targets/*.rs) it follows the `mod` declarations
(`#[path]` included) to the module tree, and records which module names
which: every `use` of the crate's own items (`crate::`, `super::`,
`self::`, a child module or a name imported earlier) and every such path
written in the code, each resolved through the `use` and `pub use`
declarations it goes through (a re-export counts as the module that
defines the item) to the module that defines it. Methods added to the
type of another module (`impl Type { ... }`, not `impl Trait for Type`)
also make that module depend on the one that adds them: it is one type
split in two.

A cycle is reported between sibling modules: `a` depends on `b` when
anything in `a` or below it names something in `b` or below it. A parent
and its child (`foo` and `foo::bar`) are not a cycle (Rust code is
written that way); two modules of different parents are compared through
the children of their nearest common ancestor (`crate::x::a` naming
`crate::y::b` is `x` depending on `y`). Each cycle is printed with the
imports that make it (file and line).

By default only the code a build compiles is read: modules, `use`
declarations and items under `#[cfg(test)]` are left out (a test naming
the code under test and its fixtures is not a design cycle). `--tests`
reads them too.

`--check ALLOW` exits 1 if a cycle is found that is not within a cycle of
the allow-list (lines `ROOT PARENT::{a, b, ...}` as printed; `#` starts a
comment); allow-list lines no longer needed are reported.

Known limits: macros are not expanded (paths inside `macro_rules!` bodies
are read as written); a name brought in by a glob import is found only
when the globbed module defines or imports it by name; a method call
(`x.f()`) is not resolved, so a module calling a trait method of another
module's type depends on it only through the names it imports.
"""

import argparse
import re
import sys
import tempfile
from pathlib import Path

# --- lexing ---------------------------------------------------------------

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*)
  | (?P<raw_string>b?r(?P<hashes>\#*)")
  | (?P<string>b?")
  | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])')
  | (?P<lifetime>'[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ident>r\#[A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>[0-9][0-9A-Za-z_.]*)
  | (?P<path_sep>::)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


def lex(text):
    """Tokens (kind, value, line), comments dropped, string contents kept."""
    tokens = []
    pos, line = 0, 1
    while pos < len(text):
        m = TOKEN.match(text, pos)
        kind = m.lastgroup
        if kind == "hashes":
            kind = "raw_string"
        if kind == "block_comment":
            depth, end = 1, m.end()
            while depth and end < len(text):
                if text.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif text.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
            value = text[pos:end]
        elif kind == "raw_string":
            close = '"' + m.group("hashes")
            end = text.find(close, m.end())
            end = len(text) if end < 0 else end + len(close)
            value = text[pos:end]
            tokens.append(("string", text[m.end() : end - len(close)], line))
        elif kind == "string":
            end = m.end()
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            value = text[pos : end + 1]
            tokens.append(("string", text[m.end() : end], line))
        else:
            value = m.group(0)
            if kind in ("ident", "lifetime", "number", "path_sep", "punct", "char"):
                if kind == "ident" and value.startswith("r#"):
                    value = value[2:]
                tokens.append((kind, value, line))
        line += value.count("\n")
        pos += len(value)
    return tokens


# --- the module tree --------------------------------------------------------

ITEM_KEYWORDS = {"struct", "enum", "union", "trait", "type", "fn", "const", "static"}


class Module:
    def __init__(self, path, file, test):
        self.path = path  # tuple of names from the root
        self.file = file
        self.test = test  # under #[cfg(test)]
        self.children = {}  # name -> Module
        self.imports = {}  # name -> [(segments, base Module)]
        self.globs = []  # [(segments, base Module)]
        self.items = set()
        self.refs = []  # (segments, base Module, line, test)
        self.impls = []  # inherent impls: (type segments, line, test)


class Crate:
    def __init__(self, root_file):
        self.root = Module((), root_file, False)
        self.modules = [self.root]
        self.parse_file(self.root, root_file, mod_rs=True)

    def parse_file(self, module, file, mod_rs):
        tokens = lex(file.read_text(encoding="utf-8"))
        # Where `mod x;` looks for x.rs: beside a mod.rs / root, else in a
        # folder named after the file.
        directory = file.parent if mod_rs else file.parent / file.stem
        Parser(self, tokens, file, directory).module_body(module, 0, len(tokens))

    def new_module(self, parent, name, test, file):
        child = Module(parent.path + (name,), file, test or parent.test)
        parent.children[name] = child
        self.modules.append(child)
        return child


def matching(tokens, i):
    """Index of the bracket closing the one at i."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = []
    while i < len(tokens):
        kind, value, _ = tokens[i]
        if kind == "punct" and value in pairs:
            stack.append(pairs[value])
        elif kind == "punct" and stack and value == stack[-1]:
            stack.pop()
            if not stack:
                return i
        i += 1
    return len(tokens) - 1


def item_end(tokens, i):
    """Index just past the item starting at i: its first `;` or the end of
    its first top-level `{}` block (whichever comes first)."""
    while i < len(tokens):
        kind, value, _ = tokens[i]
        if kind == "punct" and value in "([":
            i = matching(tokens, i) + 1
            continue
        if kind == "punct" and value == ";":
            return i + 1
        if kind == "punct" and value == "{":
            return matching(tokens, i) + 1
        i += 1
    return i


def is_cfg_test(attr_tokens):
    """`#[cfg(test)]` exactly (not `cfg(any(test, ...))`, compiled in
    other builds too)."""
    values = [v for _, v, _ in attr_tokens]
    return values == ["#", "[", "cfg", "(", "test", ")", "]"]


class Parser:
    def __init__(self, crate, tokens, file, directory):
        self.crate = crate
        self.t = tokens
        self.file = file
        self.directory = directory

    def module_body(self, module, start, end, directory=None):
        directory = directory or self.directory
        t = self.t
        i = start
        attrs = []
        while i < end:
            if t[i][1] == "#" and i + 1 < end:
                inner = t[i + 1][1] == "!"
                bracket = i + 2 if inner else i + 1
                if bracket < end and t[bracket][1] == "[":
                    close = matching(t, bracket)
                    if not inner:
                        attrs.append(t[i : close + 1])
                    i = close + 1
                    continue
            test = module.test or any(is_cfg_test(a) for a in attrs)
            path_attr = next(
                (
                    a[4][1]
                    for a in attrs
                    if len(a) > 4 and a[2][1] == "path" and a[3][1] == "=" and a[4][0] == "string"
                ),
                None,
            )
            attrs = []
            j = i
            if t[j][1] == "pub":
                j += 1
                if j < end and t[j][1] == "(":
                    j = matching(t, j) + 1
            value = t[j][1] if j < end else ""
            if value == "mod" and j + 1 < end and t[j + 1][0] == "ident":
                name = t[j + 1][1]
                module.items.add(name)
                if j + 2 < end and t[j + 2][1] == "{":
                    close = matching(t, j + 2)
                    child = self.crate.new_module(module, name, test, self.file)
                    self.module_body(child, j + 3, close, directory / name)
                    i = close + 1
                    continue
                if path_attr is not None:
                    file = directory / path_attr
                    mod_rs = file.name == "mod.rs"
                elif (directory / name / "mod.rs").exists():
                    file, mod_rs = directory / name / "mod.rs", True
                else:
                    file, mod_rs = directory / f"{name}.rs", False
                child = self.crate.new_module(module, name, test, file)
                if file.exists():
                    self.crate.parse_file(child, file, mod_rs)
                i = j + 3
                continue
            if value == "impl":
                self.inherent_impl(module, j, end, test)
            if value == "use":
                stop = j
                while stop < end and t[stop][1] != ";":
                    stop += 1
                self.use_tree(module, j + 1, stop, [], test)
                i = stop + 1
                continue
            for k in range(j, min(j + 4, end - 1)):
                if t[k][1] in ITEM_KEYWORDS and t[k + 1][0] == "ident":
                    module.items.add(t[k + 1][1])
                    break
                if t[k][1] == "macro_rules" and k + 2 < end:
                    module.items.add(t[k + 2][1])
                    break
            stop = max(min(item_end(t, j), end), i + 1)
            self.paths(module, j, stop, test)
            i = stop

    def inherent_impl(self, module, i, end, test):
        """Records the type of `impl Type {` (not `impl Trait for Type`)."""
        t = self.t
        j, angle = i + 1, 0
        segments = []
        while j < end:
            value = t[j][1]
            if value == "<":
                angle += 1
            elif value == ">" and angle:
                angle -= 1
            elif angle == 0:
                if value in ("{", "where"):
                    break
                if value == "for":
                    return
                if t[j][0] == "ident" and (not segments or t[j - 1][0] == "path_sep"):
                    segments.append(value)
            j += 1
        if segments:
            module.impls.append((segments, t[i][2], test))

    def paths(self, module, start, end, test):
        i = start
        while i < end:
            if self.t[i][0] == "ident":
                i = self.path_at(module, i, end, test)
            else:
                i += 1

    def path_at(self, module, i, end, test):
        """Records the path starting at i (if any); returns the index after it."""
        t = self.t
        segments = []
        j = i
        while j < end and t[j][0] == "ident":
            segments.append(t[j][1])
            if j + 1 < end and t[j + 1][0] == "path_sep" and j + 2 < end and t[j + 2][0] == "ident":
                j += 2
            else:
                break
        # `pub(in crate::x)` is a visibility, not a use.
        preceded_by_in = i >= 2 and t[i - 1][1] == "in" and t[i - 2][1] == "("
        previous_is_sep = i >= 1 and t[i - 1][0] == "path_sep"
        if len(segments) > 1 and not preceded_by_in and not previous_is_sep:
            module.refs.append((segments, module, t[i][2], test))
        return j + 1

    def use_tree(self, module, start, stop, prefix, test):
        """Records the imports of the use tree t[start:stop] under `prefix`."""
        t = self.t
        i = start
        segments = list(prefix)
        line = t[start][2] if start < stop else 0
        while i < stop:
            kind, value, _ = t[i]
            if kind == "path_sep":
                i += 1
            elif kind == "ident":
                segments.append(value)
                i += 1
                if i < stop and t[i][1] == "as":
                    alias = t[i + 1][1]
                    if alias != "_":
                        self.add_import(module, alias, segments, test, line)
                    else:
                        self.add_import(module, None, segments, test, line)
                    return
            elif value == "*":
                module.globs.append((segments, module))
                module.refs.append((segments, module, line, test))
                return
            elif value == "{":
                close = matching(t, i)
                parts, depth, part_start = [], 0, i + 1
                for k in range(i + 1, close):
                    v = t[k][1]
                    if v == "{":
                        depth += 1
                    elif v == "}":
                        depth -= 1
                    elif v == "," and depth == 0:
                        parts.append((part_start, k))
                        part_start = k + 1
                parts.append((part_start, close))
                for a, b in parts:
                    if a < b:
                        self.use_tree(module, a, b, segments, test)
                return
            else:
                i += 1
        if segments:
            name = segments[-1]
            if name == "self":
                segments = segments[:-1]
                name = segments[-1] if segments else None
            self.add_import(module, name, segments, test, line)

    def add_import(self, module, name, segments, test, line):
        if len(segments) > 1 and segments[-1] == "self":
            segments = segments[:-1]
        if name is not None:
            module.imports.setdefault(name, []).append((segments, module))
        module.refs.append((segments, module, line, test))


# --- resolving paths ----------------------------------------------------------


class Resolver:
    def __init__(self, crate):
        self.crate = crate
        self.by_path = {m.path: m for m in crate.modules}

    def start(self, segments, base):
        """The module a path starts from, and the segments left; None for a
        path outside the crate (another crate, a local name)."""
        first = segments[0]
        if first == "crate":
            return self.crate.root, segments[1:]
        if first == "super":
            module, rest = base, segments
            while rest and rest[0] == "super":
                if not module.path:
                    return None
                module = self.by_path[module.path[:-1]]
                rest = rest[1:]
            return module, rest
        if first == "self":
            return base, segments[1:]
        if first in base.children or first in base.imports or first in base.items:
            return base, segments
        for glob, glob_base in base.globs:
            target = self.module_of(glob, glob_base, set())
            if target and (first in target.children or first in target.imports):
                return base, segments
        return None

    def module_of(self, segments, base, seen):
        """The module a path names (all its segments modules), else None."""
        found = self.resolve(segments, base, seen)
        if found and found[1]:
            return found[0]
        return None

    def resolve(self, segments, base, seen):
        """(module, whole): the module that defines what the path names,
        and whether the path names that module itself."""
        key = (tuple(segments), base.path)
        if key in seen:
            return None
        started = self.start(segments, base)
        if started is None:
            return None
        module, rest = started
        return self.walk(module, rest, seen | {key})

    def walk(self, module, rest, seen):
        """Follows the names of `rest` from `module`."""
        for k, name in enumerate(rest):
            if name in module.children:
                module = module.children[name]
                continue
            if name in module.items:
                return module, False
            for target_segments, target_base in module.imports.get(name, []):
                found = self.resolve(target_segments, target_base, seen)
                if found:
                    target, whole = found
                    if whole:
                        return self.walk(target, rest[k + 1 :], seen)
                    return target, False
            for glob, glob_base in module.globs:
                target = self.module_of(glob, glob_base, seen)
                if target is None or target is module:
                    continue
                if name in target.children or name in target.items or name in target.imports:
                    return self.walk(target, rest[k:], seen)
            return module, False
        return module, True


# --- cycles -------------------------------------------------------------------------


def edges_of(crate, with_tests, workspace):
    """{(from, to): ["file:line module -> module"]} between sibling
    modules, keyed by the siblings' paths."""
    resolver = Resolver(crate)
    edges = {}
    for module in crate.modules:
        if module.test and not with_tests:
            continue
        for segments, base, line, test in module.refs:
            if test and not with_tests:
                continue
            found = resolver.resolve(segments, base, set())
            if not found:
                continue
            target = found[0].path
            source = module.path
            common = 0
            while common < min(len(source), len(target)) and source[common] == target[common]:
                common += 1
            if common in (len(source), len(target)):
                continue  # the same module, or an ancestor and its descendant
            edge = (source[: common + 1], target[: common + 1])
            where = f"{module.file.relative_to(workspace)}:{line} {'::'.join(source) or 'crate'} -> {'::'.join(target)}"
            edges.setdefault(edge, []).append(where)
        # Methods added to a type of another module: that module, whose
        # type they extend, depends on them too.
        for segments, line, test in module.impls:
            if test and not with_tests:
                continue
            found = resolver.resolve(segments, module, set())
            if not found:
                continue
            home = found[0].path
            source = module.path
            common = 0
            while common < min(len(source), len(home)) and source[common] == home[common]:
                common += 1
            if common in (len(source), len(home)):
                continue
            edge = (home[: common + 1], source[: common + 1])
            where = (
                f"{module.file.relative_to(workspace)}:{line} {'::'.join(home) or 'crate'} -> "
                f"{'::'.join(source)} (impl {'::'.join(segments)} here)"
            )
            edges.setdefault(edge, []).append(where)
    return edges


def cycles(edges):
    """Strongly connected components of more than one module, per parent."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def roots(workspace):
    found = []
    crate_dirs = sorted(p.parent for p in (workspace / "crates").glob("*/Cargo.toml"))
    if (workspace / "fuzz" / "Cargo.toml").exists():
        crate_dirs.append(workspace / "fuzz")
    for crate_dir in crate_dirs:
        files = [crate_dir / "src" / "lib.rs", crate_dir / "src" / "main.rs"]
        for folder in ("src/bin", "tests", "benches", "examples", "fuzz_targets"):
            files += sorted((crate_dir / folder).glob("*.rs"))
            files += sorted((crate_dir / folder).glob("*/main.rs"))
        found += [f for f in files if f.exists()]
    return found


def describe(parent, component):
    names = ", ".join(c[-1] for c in component)
    return f"{'::'.join(parent) or 'crate'}::{{{names}}}"


def find(workspace, with_tests):
    """Every cycle of every crate: (root, description, component, edges)."""
    found = []
    for root_file in roots(workspace):
        label = str(root_file.relative_to(workspace))
        crate = Crate(root_file)
        edges = edges_of(crate, with_tests, workspace)
        for component in cycles(edges):
            found.append((label, describe(component[0][:-1], component), component, edges))
    return found


def members(description):
    parent, names = description.rsplit("::{", 1)
    return parent, {n.strip() for n in names.rstrip("}").split(",")}


# A crate that has each case once: a cycle by `use` and by a path in the
# code; a re-export followed to the module defining the item; a parent
# and its child; `super::` from an inline module; comments, strings and a
# `pub(in ...)` visibility that name modules without using them; a
# cycle only through `#[cfg(test)]` code; methods added to another
# module's type (a cycle) and a trait implemented for it (none).
SELF_TEST = {
    "crates/x/Cargo.toml": "",
    "crates/x/src/lib.rs": """
mod a;
mod b;
mod c;
pub mod d;
mod e;
mod f;
mod g;
mod h;
pub use d::Thing;
#[cfg(test)]
mod fixtures;
""",
    "crates/x/src/a.rs": """
use crate::b::B;
pub struct A(B, crate::e::E);
#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
}
""",
    "crates/x/src/b.rs": """
pub struct B;
pub(crate) fn f() -> Option<super::a::A> { None }
""",
    "crates/x/src/c.rs": """
use crate::Thing;
pub struct C(Thing);
""",
    "crates/x/src/d/mod.rs": """
mod inner;
pub use inner::Thing;
fn helper() {}
""",
    "crates/x/src/d/inner.rs": """
use super::helper;
pub struct Thing(Option<Box<crate::c::C>>);
""",
    "crates/x/src/e.rs": """
// use crate::a::A;
/* crate::a::A /* nested */ crate::b::B */
pub(in crate::e) struct Hidden;
pub struct E;
const S: &str = "crate::a::A";
const R: &str = r#"crate::b::B "quoted""#;
const C: char = '"';
fn g<'a>(x: &'a str) -> &'a str { x }
""",
    "crates/x/src/f.rs": """
pub struct F;
""",
    "crates/x/src/g.rs": """
use crate::f::F;
impl<'a> F {
    pub fn new() -> Self { F }
}
""",
    "crates/x/src/h.rs": """
impl Default for crate::f::F {
    fn default() -> Self { crate::f::F }
}
""",
    "crates/x/src/fixtures.rs": """
pub use crate::a::A;
""",
}


def self_test():
    """Runs the checker on SELF_TEST; 0 if it finds exactly its cycles."""
    with tempfile.TemporaryDirectory() as directory:
        workspace = Path(directory)
        for name, text in SELF_TEST.items():
            (workspace / name).parent.mkdir(parents=True, exist_ok=True)
            (workspace / name).write_text(text, encoding="utf-8")
        failed = 0
        for with_tests, expected in (
            (False, {"crate::{a, b}", "crate::{c, d}", "crate::{f, g}"}),
            (True, {"crate::{a, b, fixtures}", "crate::{c, d}", "crate::{f, g}"}),
        ):
            got = {description for _, description, _, _ in find(workspace, with_tests)}
            if got != expected:
                print(f"self-test (tests: {with_tests}): found {sorted(got)}, expected {sorted(expected)}")
                failed += 1
    print(f"module cycles self-test: {'failed' if failed else 'passed'}")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", action="store_true", help="read #[cfg(test)] code too")
    parser.add_argument("--check", metavar="ALLOW", help="fail on a cycle not in this allow-list")
    parser.add_argument("--verbose", action="store_true", help="every import of each edge, not the first")
    parser.add_argument("--self-test", action="store_true", help="check the checker on a crate made for it")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    workspace = Path(__file__).resolve().parent.parent
    found = find(workspace, args.tests)

    allowed = []
    if args.check:
        for raw in Path(args.check).read_text(encoding="utf-8").splitlines():
            line = raw.split("#", 1)[0].strip()
            if line:
                root, cycle = line.split(None, 1)
                allowed.append((root, cycle.strip(), [False]))

    new = 0
    for label, description, component, edges in found:
        parent, names = members(description)
        match = None
        for entry in allowed:
            allowed_parent, allowed_names = members(entry[1])
            if entry[0] == label and allowed_parent == parent and names <= allowed_names:
                match = entry
        if match:
            match[2][0] = True
        elif args.check:
            new += 1
        status = "allowed" if match else ("NEW" if args.check else "cycle")
        print(f"{status}: {label} {description}")
        for a in component:
            for b in component:
                for where in edges.get((a, b), [])[: None if args.verbose else 1]:
                    print(f"    {where}")
    for root, cycle, used in allowed:
        if not used[0]:
            print(f"no longer a cycle (remove it from {args.check}): {root} {cycle}")
    print(f"module cycles: {len(found)} found, {new} not allowed")
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
