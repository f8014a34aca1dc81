#!/usr/bin/env python3
"""Check the observability kit: the alert rules with `promtool check rules` and their unit tests
(`alerts.test.yml`) with `promtool test rules`, the Grafana
dashboard as JSON whose every query is valid PromQL (promtool again, on a rules file made of the
dashboard's queries with Grafana's variables filled in), and every metric they name is one the
library exports (names read from its observe.rs).

Without promtool (it could not be installed), the rules file is read as YAML (each rule an
`alert` or a `record` with an `expr`) and every expression goes through the PromQL syntax check
below: tokens, balanced brackets, label matchers, range durations and function names. The
check refuses a set of broken expressions first, so it is known to be able to fail."""
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "count_over_time", "day_of_month", "day_of_week", "delta", "deriv", "exp",
    "floor", "histogram_quantile", "holt_winters", "hour", "idelta", "increase", "irate",
    "label_join", "label_replace", "last_over_time", "ln", "log2", "log10", "max_over_time",
    "min_over_time", "minute", "month", "predict_linear", "present_over_time",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt",
    "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector", "year",
}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless"}
TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+)
  | (?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:.]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=])
  | (?P<punct>[(){}\[\],:])
""", re.VERBOSE)


def promql_errors(expr: str) -> list:
    """Syntax problems of one PromQL expression (an empty list when it reads well)."""
    tokens, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            return [f"unexpected character {expr[pos]!r} at {pos}"]
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
    errors, stack = [], []
    for i, (kind, text) in enumerate(tokens):
        prev = tokens[i - 1] if i else (None, None)
        nxt = tokens[i + 1] if i + 1 < len(tokens) else (None, None)
        inside = stack[-1] if stack else None
        if kind == "punct" and text in "({[":
            if text == "(" and prev[0] == "ident" and prev[1] not in KEYWORDS \
                    and prev[1] not in FUNCTIONS | AGGREGATIONS:
                errors.append(f"unknown function {prev[1]}")
            if text == "[" and not (nxt[0] == "duration"):
                errors.append("a range selector holds a duration, like [5m]")
            stack.append(text)
        elif kind == "punct" and text in ")}]":
            if not stack or {"(": ")", "{": "}", "[": "]"}[stack.pop()] != text:
                errors.append(f"unbalanced {text!r}")
        elif inside == "{":
            # label matchers: name op "value", separated by commas
            if kind == "ident" and not (nxt[0] == "op" and nxt[1] in ("=", "!=", "=~", "!~")):
                errors.append(f"label {text} is not followed by a matcher")
            if kind == "op" and not (nxt[0] == "string"):
                errors.append(f"matcher {text} is not followed by a quoted value")
        elif inside == "[" and kind not in ("duration",) and text != ":":
            errors.append(f"{text!r} in a range selector")
        if kind == "ident" and text in ("by", "without", "on", "ignoring") and nxt[1] != "(":
            errors.append(f"{text} takes a label list in parentheses")
    if stack:
        errors.append(f"unclosed {stack[-1]!r}")
    if tokens and (tokens[-1][0] == "op" or tokens[0][0] == "op" and tokens[0][1] != "-"):
        errors.append("an operator without an operand")
    return errors


def check_rules_without_promtool(path: pathlib.Path) -> bool:
    """The fallback for `promtool check rules`: structure when PyYAML is there, then syntax."""
    text = path.read_text()
    try:
        import yaml
        groups = yaml.safe_load(text)["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        bad = [r for r in rules if "expr" not in r or ("alert" in r) == ("record" in r)]
        if bad:
            print(f"{path.name}: a rule needs an expr and exactly one of alert, record: {bad[0]}")
            return False
        exprs = [str(r["expr"]) for r in rules]
    except ImportError:
        exprs = [json.loads(e) for e in re.findall(r"expr: (\".*\")$", text, re.M)]
    ok = True
    for expr in exprs:
        for error in promql_errors(expr):
            print(f"{path.name}: {error} in: {expr.strip()}")
            ok = False
    print(f"{path.name}: {len(exprs)} expressions read (PromQL syntax check, no promtool)")
    return ok


BROKEN = ["sum(rate(x[5m])", "rate(x[5])", "sum by job (x)", "x{job=}", "nosuchfn(x)", "x >",
          "x{job=\"a\"", "rate(x[5m]]"]

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
    promtool = shutil.which("promtool")
    if not promtool:
        missed = [e for e in BROKEN if not promql_errors(e)]
        if missed:
            sys.exit(f"the PromQL syntax check accepts broken expressions: {missed}")
    for path in (kit / "alerts.yml", rules):
        if promtool:
            result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
            print(result.stdout.strip() or result.stderr.strip())
            failed |= result.returncode != 0
        else:
            failed |= not check_rules_without_promtool(path)

tests = kit / "alerts.test.yml"
if promtool:
    # The alerts' own unit tests: which series make each alert fire, and which must not.
    result = subprocess.run([promtool, "test", "rules", tests.name], cwd=kit, capture_output=True, text=True)
    print(result.stdout.strip() or result.stderr.strip())
    failed |= result.returncode != 0
else:
    print(f"{tests.name}: not run (needs promtool)")

print(f"{len(queries)} dashboard queries, {alerts.count('- alert:')} alerts, {len(exported)} exported metrics")
sys.exit(1 if failed else 0)
