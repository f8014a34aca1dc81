#!/usr/bin/env python3
"""Check the observability kit: the alert rules with `promtool check rules`, the Grafana
dashboard as JSON whose every query is valid PromQL (promtool again, on a rules file made of the
dashboard's queries with Grafana's variables filled in), and every metric they name is one the
library exports (names read from its observe.rs)."""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
kit = root / "observability"
observe = (root / "crates/tower-idempotency/src/observe.rs").read_text()
exported = set(re.findall(r'const [A-Z_]+: &str = "(idempotency_[a-z_]+)"', observe))
# A histogram is queried through its series.
series = exported | {f"{h}{s}" for h in exported for s in ("_bucket", "_sum", "_count")}

dashboard = json.loads((kit / "grafana-dashboard.json").read_text())
queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
if not queries:
    sys.exit("the dashboard has no queries")

def fill(expr: str) -> str:
    return (expr.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$route", ".*"))

alerts = (kit / "alerts.yml").read_text()
failed = False
for text in queries + [alerts]:
    for name in set(re.findall(r"\b(idempotency_[a-z_]+)", text)):
        if name not in series:
            print(f"unknown metric {name}: not exported by the library")
            failed = True

with tempfile.TemporaryDirectory() as tmp:
    rules = pathlib.Path(tmp) / "dashboard-queries.yml"
    body = "groups:\n  - name: dashboard\n    rules:\n"
    for i, expr in enumerate(queries):
        body += f"      - record: dashboard:query_{i}\n        expr: {json.dumps(fill(expr))}\n"
    rules.write_text(body)
    for path in (kit / "alerts.yml", rules):
        result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
        print(result.stdout.strip() or result.stderr.strip())
        failed |= result.returncode != 0

print(f"{len(queries)} dashboard queries, {alerts.count('- alert:')} alerts, {len(exported)} exported metrics")
sys.exit(1 if failed else 0)
