#!/usr/bin/env python3
"""Prints the library's module graph (top-level modules of crates/tower-idempotency/src and what
each one imports through `crate::`), and exits 1 if the graph has a cycle, if a module imports
a sibling through a re-export of `lib.rs`, or if two files of any crate of the workspace import
each other in a loop (file by file: `service/prepare.rs` and `service/refuse.rs` may not take
names from each other, nor may three files in a ring). A file's ties to its own parent module
and children (`mod.rs` and the files it declares) are the module tree itself, not a loop.
Before it reads the workspace it checks itself on a planted crate (a loop it must see, a
parent and child it must not call one), so a checker that stopped seeing loops fails too.

    python3 scripts/module-graph.py

Re-exports are followed: a path that reaches an item through `pub use` (in `lib.rs` or in another
module) is an edge to the module that defines the item too, so a cycle that passes through a
re-export is found. `lib.rs` is the front door only (crate docs and `pub use`): modules name each
other by their module path (`crate::layer::Idempotency`), never `crate::Idempotency`.

Test modules (`#[cfg(test)]` and below, `tests.rs` files and `tests/` folders) are left out: tests may reach
anywhere. Comments (doc links included) are not imports.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")
SRC = os.path.join(ROOT, "crates", "tower-idempotency", "src")


def code_of(source):
    """The source without its test module and its comments."""
    source = re.split(r"#\[cfg\((?:all\()?test\b[^\]]*\]\s*mod \w+\s*\{", source)[0]
    return re.sub(r"//.*", "", source)


def split_top(group):
    """`a::{b, c}, d` -> ["a::{b, c}", "d"]."""
    depth, part, parts = 0, "", []
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        part += ch
    parts.append(part)
    return [p.strip() for p in parts if p.strip()]


def expand(tree):
    """A use tree (`a::{b::C, d as E}`) as (path, name it is known by) pairs."""
    tree = " ".join(tree.split())
    tree = re.sub(r"\s*::\s*", "::", tree)
    brace = tree.find("{")
    if brace < 0:
        path, _, alias = tree.partition(" as ")
        path = path.strip()
        return [(path, alias.strip() or path.split("::")[-1])]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    found = []
    for part in split_top(inner):
        for path, name in expand(part):
            if path == "self":
                found.append((prefix.rstrip(":"), prefix.rstrip(":").split("::")[-1]))
            else:
                found.append((prefix + path, name))
    return found


def uses(code):
    """Every `[pub] use` statement: (is it `pub`, path, name) for each leaf."""
    found = []
    for vis, tree in re.findall(r"(pub(?:\([\w:]+\))?\s+)?\buse\s+([^;]+);", code):
        for path, name in expand(tree):
            found.append((bool(vis), path, name))
    return found


def absolute(path, module_path, modules):
    """`super::x`, `self::x` and `child::x` from the module at `module_path` (a list) as a path
    from the crate root (a list); `crate::x` as is; anything else (an outside crate) as None."""
    parts = path.split("::")
    if parts[0] == "crate":
        return parts[1:]
    base = list(module_path)
    if parts[0] not in ("self", "super"):
        return base + parts if tuple(base + parts[:1]) in modules else None
    while parts and parts[0] in ("self", "super"):
        if parts[0] == "super":
            base = base[:-1]
        parts = parts[1:]
    return base + parts


def load(src=SRC):
    """{module path (tuple): code} for every file of the crate whose sources are in `src`
    (binaries under `bin/` are crates of their own, and left out)."""
    files = {}
    for root, _, names in os.walk(src):
        folders = os.path.relpath(root, src).split(os.sep)
        if "tests" in folders or folders[0] == "bin":
            continue
        for name in names:
            if not name.endswith(".rs") or name == "tests.rs":
                continue
            rel = os.path.relpath(os.path.join(root, name), src).removesuffix(".rs")
            parts = rel.split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            if parts in (["lib"], ["main"]):
                parts = []
            with open(os.path.join(root, name), encoding="utf-8") as f:
                files[tuple(parts)] = code_of(f.read())
    return files


def reexports(files):
    """{(module path, name): target path from the root} for every `pub use`."""
    table = {}
    for module, code in files.items():
        for public, path, name in uses(code):
            if public:
                target = absolute(path, list(module), files)
                if target:
                    table[(module, name)] = target
    return table


def resolve(path, table, seen=()):
    """Every top-level module a path from the root passes through, re-exports followed."""
    reached = {path[0]} if path else set()
    for cut in range(1, len(path) + 1):
        key = (tuple(path[: cut - 1]), path[cut - 1])
        if key in table and key not in seen:
            target = table[key] + path[cut:]
            reached |= resolve(target, table, seen + (key,))
    return reached


def graph():
    files = load()
    table = reexports(files)
    top = {m[0] for m in files if m}
    edges, through_lib = {}, []
    for module, code in files.items():
        if not module:
            continue
        paths = [absolute(p, list(module), files) for _, p, _ in uses(code)]
        paths += [p.split("::") for p in re.findall(r"(?<![\w:])crate::((?:\w+::)*\w+)", code)]
        deps = edges.setdefault(module[0], set())
        for path in filter(None, paths):
            if path and path[0] not in top:
                through_lib.append(("/".join(module), "crate::" + "::".join(path)))
            deps |= resolve(path, table)
    for module, deps in edges.items():
        deps.discard(module)
        deps &= top
    return edges, sorted(set(through_lib))


def defining_file(path, files, table, seen=()):
    """The files a path from the root reaches: the deepest module file it names, and, where that
    name is a `pub use`, the file the re-export leads to."""
    cut = max(n for n in range(len(path) + 1) if tuple(path[:n]) in files)
    module = tuple(path[:cut])
    reached = {module}
    if cut < len(path):
        key = (module, path[cut])
        if key in table and key not in seen:
            reached |= defining_file(table[key] + path[cut + 1 :], files, table, seen + (key,))
    return reached


def file_graph(src):
    """{file: files it takes names from} for one crate, ties along the module tree left out."""
    files = load(src)
    table = reexports(files)
    edges = {}
    for module, code in files.items():
        paths = [absolute(p, list(module), files) for _, p, _ in uses(code)]
        paths += [p.split("::") for p in re.findall(r"(?<![\w:])crate::((?:\w+::)*\w+)", code)]
        deps = edges.setdefault(module, set())
        for path in filter(None, paths):
            for target in defining_file(path, files, table):
                if target[: len(module)] != module and module[: len(target)] != target:
                    deps.add(target)
    return edges


def crate_sources():
    """The source folder of every crate of the workspace."""
    found = []
    for base in ("crates", "examples"):
        for name in sorted(os.listdir(os.path.join(ROOT, base))):
            src = os.path.join(ROOT, base, name, "src")
            if os.path.isdir(src):
                found.append(os.path.normpath(src))
    return found


def cycles(edges):
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def checker_sees_loops():
    """The file check on a planted crate: two files that import each other are a loop; a
    `mod.rs` and the child it imports from (and that imports from it) are not."""
    import tempfile

    planted = {
        "lib.rs": "mod a;\nmod b;\nmod tree;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "use crate::a::A;\npub struct B;\n",
        "tree/mod.rs": "mod leaf;\nuse leaf::Leaf;\npub struct Root;\n",
        "tree/leaf.rs": "use super::Root;\npub struct Leaf;\n",
    }
    with tempfile.TemporaryDirectory() as src:
        for name, code in planted.items():
            os.makedirs(os.path.dirname(os.path.join(src, name)), exist_ok=True)
            with open(os.path.join(src, name), "w", encoding="utf-8") as f:
                f.write(code)
        found = cycles(file_graph(src))
    return [sorted(loop[:-1]) for loop in found] == [[("a",), ("b",)]]


def main():
    if not checker_sees_loops():
        print("the file check missed a planted loop, or saw one along the module tree")
        return 1
    edges, through_lib = graph()
    for module in sorted(edges):
        print(f"{module} -> {', '.join(sorted(edges[module])) or '(nothing)'}")
    found = cycles(edges)
    for cycle in found:
        print("cycle: " + " -> ".join(cycle))
    for module, path in through_lib:
        print(f"through lib.rs: {module} uses {path}; name the module instead")
    print(f"{len(edges)} modules, {len(found)} cycles, {len(through_lib)} imports through lib.rs")
    loops, files = [], 0
    for src in crate_sources():
        graph_of_files = file_graph(src)
        files += len(graph_of_files)
        crate = os.path.relpath(os.path.dirname(src), ROOT)
        for loop in cycles(graph_of_files):
            names = [crate + "/src/" + ("/".join(m) or "lib/main") for m in loop]
            loops.append(names)
            print("file loop: " + " -> ".join(names))
    print(f"{files} files in {len(crate_sources())} crates, {len(loops)} file loops")
    return 1 if found or through_lib or loops else 0


if __name__ == "__main__":
    sys.exit(main())
