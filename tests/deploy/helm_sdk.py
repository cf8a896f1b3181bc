#!/usr/bin/env python3
"""`helm lint` and `helm template` through Helm's own Go library.

No helm binary can be had from the registries reached here (Debian packages none, and Helm's
source cannot be fetched), but the PyPI package helm-python-sdk ships Helm v4's Go packages
(pkg/lint, pkg/engine, pkg/chart loaders) compiled into libhelm_c.so. This script calls them:

  helm_sdk.py lint CHART [VALUES.yaml...]
      Helm's lint (strict: warnings fail too) with the chart's values merged with each file.
  helm_sdk.py template CHART RELEASE NAMESPACE OUT.yaml [VALUES.yaml...]
      Helm's template engine, offline (`lookup` answers nothing, as in `helm template`): writes
      every rendered manifest, in file order, as one multi-document YAML (NOTES.txt left out).
"""
import sys

import helm_python
import yaml


def values_of(files):
    merged = {}
    for path in files:
        with open(path) as f:
            merged = merge(merged, yaml.safe_load(f) or {})
    return merged


def merge(base, over):
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def lint(chart, files):
    report = helm_python.lint(chart, values_of(files), strict=True, namespace="gpuwatch")
    bad = False
    for m in report.get("messages") or []:
        sev = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}.get(m.get("severity"), m.get("severity"))
        print(f"[{sev}] {m.get('path')}: {m.get('error')}")
        bad = bad or m.get("severity", 0) >= 2
    for e in report.get("errors") or []:
        print(f"[ERROR] {e}")
        bad = True
    label = " + ".join(files) if files else "default values"
    if bad:
        sys.exit(f"helm lint {chart} ({label}): failed")
    print(f"helm lint {chart} ({label}): {report.get('total_charts_linted')} chart(s) linted, 0 failed")


def template(chart, release, namespace, out, files):
    c = helm_python.Chart.load(chart)
    rendered = c.render(values_of(files), name=release, namespace=namespace, is_install=True)
    docs = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt") or not rendered[path].strip():
            continue
        docs.append(f"# Source: {path}\n{rendered[path].strip()}\n")
    with open(out, "w") as f:
        f.write("---\n".join(docs))
    if "NOTES" in " ".join(rendered):
        notes = [v for k, v in rendered.items() if k.endswith("NOTES.txt")]
        with open(out + ".NOTES.txt", "w") as f:
            f.write(notes[0] if notes else "")
    print(f"helm template {chart} ({' + '.join(files) or 'default values'}): {len(docs)} files -> {out}")


def main(argv):
    print(f"# helm-python-sdk {helm_python.__version__}, Helm {helm_python.helm_sdk_version()}", file=sys.stderr)
    if len(argv) >= 3 and argv[1] == "lint":
        return lint(argv[2], argv[3:])
    if len(argv) >= 6 and argv[1] == "template":
        return template(argv[2], argv[3], argv[4], argv[5], argv[6:])
    sys.exit(__doc__)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except helm_python.HelmError as e:
        sys.exit(f"helm: {e}")
