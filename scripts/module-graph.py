#!/usr/bin/env python3
"""Prints the library's module graph (top-level modules of crates/tower-idempotency/src and what
each one imports through `crate::`), and exits 1 if the graph has a cycle.

    python3 scripts/module-graph.py

Test modules (`#[cfg(test)]` and below) are left out: tests may reach anywhere.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "crates", "tower-idempotency", "src")


def imports(source):
    source = source.split("#[cfg(test)]")[0]
    source = re.sub(r"//.*", "", source)
    found = set(re.findall(r"crate::(\w+)", source))
    for group in re.findall(r"crate::\{(.*?)\};", source, re.S):
        depth, name, names = 0, "", []
        for ch in group:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                names.append(name)
                name = ""
                continue
            name += ch
        names.append(name)
        found.update(n.strip().split("::")[0].strip("{} \n") for n in names)
    return {n for n in found if n}


def graph():
    edges = {}
    for root, _, files in os.walk(SRC):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.relpath(os.path.join(root, name), SRC)
            module = path.split(os.sep)[0].removesuffix(".rs")
            if module == "lib":
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                edges.setdefault(module, set()).update(imports(f.read()) - {module})
    return {m: {d for d in deps if d in edges} for m, deps in edges.items()}


def cycles(edges):
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def main():
    edges = graph()
    for module in sorted(edges):
        print(f"{module} -> {', '.join(sorted(edges[module])) or '(nothing)'}")
    found = cycles(edges)
    for cycle in found:
        print("cycle: " + " -> ".join(cycle))
    print(f"{len(edges)} modules, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
