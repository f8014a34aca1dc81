#!/usr/bin/env python3
"""Each named package declares a `rust-version`, and the workspace lints keep
`clippy::incompatible_msrv` on, so clippy checks the code against it."""
import json
import subprocess
import sys

meta = json.loads(
    subprocess.check_output(["cargo", "metadata", "--no-deps", "--format-version", "1"])
)
packages = {p["name"]: p for p in meta["packages"]}
failed = False
for name in sys.argv[1:]:
    package = packages.get(name)
    if package is None:
        print(f"{name}: not a workspace member")
        failed = True
    elif not package.get("rust_version"):
        print(f"{name}: no rust-version in its Cargo.toml")
        failed = True
    else:
        print(f"{name}: rust-version {package['rust_version']}")
if failed:
    sys.exit(1)
