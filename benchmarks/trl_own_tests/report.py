"""Compare plain vs swapped outcomes from $WORK/results/*.xml; print counts and grouped differences.

python report.py            -> markdown on stdout (also $WORK/results/report.md)
"""

import os
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

WORK = Path(os.environ.get("WORK", "/tmp/trl_own_tests"))
RES = WORK / "results"
FILES = ["sft", "dpo", "grpo", "kto", "reward", "rloo", "distill"]


def parse(paths):
    out = {}
    for p in paths:
        if not Path(p).exists():
            continue
        try:
            root = ET.parse(p).getroot()
        except ET.ParseError:
            continue
        for tc in root.iter("testcase"):
            tid = tc.get("classname", "") + "::" + tc.get("name", "")
            status, msg = "passed", ""
            for child in tc:
                if child.tag in ("failure", "error"):
                    status, msg = "failed", (child.get("message") or child.text or "").strip()
                    break
                if child.tag == "skipped":
                    status, msg = "skipped", child.get("message") or ""
            if status != "passed" or tid not in out:
                out[tid] = (status, msg)
    return out


def parse_progress(log, ids_file):
    """Fallback for a one-process run cut short (no junit xml yet): map pytest -q's progress
    characters onto the collected ids, in order. Messages are then unknown."""
    import re as _re

    ids = [line.strip() for line in Path(ids_file).read_text().splitlines() if line.strip()]
    chars = ""
    for line in Path(log).read_text().splitlines():
        m = _re.fullmatch(r"([.FEsxX]+)\s*(\[\s*\d+%\])?", line.strip())
        if not m:
            break
        chars += m.group(1)
    out = {}
    for nodeid, ch in zip(ids, chars):
        path, *rest = nodeid.split("::")
        tid = path[:-3].replace("/", ".") + "." + ".".join(rest[:-1]) + "::" + rest[-1]
        out[tid] = {".": ("passed", ""), "s": ("skipped", "")}.get(
            ch, ("failed", "(partial run: message unknown)")
        )
    return out


def first_line(msg):
    line = msg.strip().splitlines()[0] if msg.strip() else "(no message)"
    return line[:300]


def group_key(msg):
    line = first_line(msg)
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"/tmp/[^\s'\"]+", "<tmp>", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return line[:120]


def main():
    rows, diffs, plain_fail_groups = [], defaultdict(list), {}
    for mode in ("one", "fresh"):
        for key in FILES:
            if mode == "one":
                plain, rf = (
                    parse([RES / f"one-plain-{key}.xml"]),
                    parse([RES / f"one-rf-{key}.xml"]),
                )
                if (
                    not rf
                    and (RES / f"one-rf-{key}.log").exists()
                    and (RES / f"ids-{key}.txt").exists()
                ):
                    rf = parse_progress(RES / f"one-rf-{key}.log", RES / f"ids-{key}.txt")
                    print(
                        f"NOTE: {key} one-process swapped run incomplete: {len(rf)} tests from "
                        "its progress line"
                    )
            else:
                plain = parse(sorted((RES / f"fresh-plain-{key}").glob("*.xml")))
                rf = parse(sorted((RES / f"fresh-rf-{key}").glob("*.xml")))
            if not plain or not rf:
                continue
            common = set(plain) & set(rf)
            plain_pass = [t for t in common if plain[t][0] == "passed"]
            rf_pass = [t for t in plain_pass if rf[t][0] == "passed"]
            c = Counter(plain[t][0] for t in common)
            if mode == "one":
                plain_fail_groups[key] = Counter(
                    group_key(m) for s, m in plain.values() if s == "failed"
                )
            rows.append(
                (
                    key,
                    mode,
                    len(common),
                    c["passed"],
                    c["failed"],
                    c["skipped"],
                    len(plain_pass),
                    len(rf_pass),
                    sum(1 for t in common if plain[t][0] != "passed" and rf[t][0] == "passed"),
                )
            )
            for t in plain_pass:
                if rf[t][0] != "passed":
                    diffs[(mode, key)].append((t, rf[t][0], rf[t][1]))
    lines = [
        "| file | mode | tests run (both) | plain pass | plain fail | plain skip | "
        "plain passes run swapped | of those pass swapped | % | swapped-only passes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, mode, n, pp, pf, ps, npp, nrp, extra in rows:
        pct = f"{100 * nrp / npp:.1f}" if npp else "-"
        lines.append(
            f"| {key} | {mode} | {n} | {pp} | {pf} | {ps} | {npp} | {nrp} | {pct} | {extra} |"
        )
    lines.append("")
    for (mode, key), items in diffs.items():
        lines.append(
            f"### {key} / {mode}-process: {len(items)} plain passes that do not pass swapped"
        )
        groups = defaultdict(list)
        for t, status, msg in items:
            groups[group_key(msg) if status == "failed" else f"({status}) {group_key(msg)}"].append(
                (t, msg)
            )
        for _, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            t, msg = members[0]
            lines.append(f"- **{len(members)}** x `{first_line(msg)}`")
            lines.append(
                f"  - e.g. `{t.split('.')[-1]}`"
                + (
                    f" (+{len(members) - 1} more: "
                    + ", ".join(m[0].split("::")[-1] for m in members[1:6])
                    + (", ..." if len(members) > 6 else "")
                    + ")"
                    if len(members) > 1
                    else ""
                )
            )
        lines.append("")
    lines.append("### Why plain TRL itself fails (one-process runs; these tests do not count)")
    for key, groups in plain_fail_groups.items():
        lines.append(f"- {key}: " + "; ".join(f"{n} x `{g}`" for g, n in groups.most_common()))
    text = "\n".join(lines)
    (RES / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
