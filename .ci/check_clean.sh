#!/usr/bin/env bash
# Fails when nbdev_export or nbdev_clean would change a tracked file, when a committed notebook carries outputs,
# or when data or run files are tracked (patient data never reaches git).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
fail=0
tracked=$(git ls-files | grep -E '^(data|runs|_docs)/' || true)
if [ -n "$tracked" ]; then echo "check_clean: data, run or built-docs files are tracked:"; echo "$tracked"; fail=1; fi
if [ -n "${TRIAGE_CF_DATA:-}" ] && [ -d "$TRIAGE_CF_DATA" ]; then
  # no tracked file may be byte-identical to a file under the data root
  data_sums=$(find "$TRIAGE_CF_DATA" -type f -size -200M -exec sha256sum {} + 2>/dev/null | cut -c1-64 | sort -u)
  repo_sums=$(git ls-files -z | xargs -0 -r sha256sum 2>/dev/null | cut -c1-64 | sort -u)
  common=$(comm -12 <(echo "$data_sums") <(echo "$repo_sums") | grep -v '^$' || true)
  if [ -n "$common" ]; then echo "check_clean: a tracked file has the same bytes as a file under the data root"; fail=1; fi
fi
$BIN/python - <<'PY' || fail=1
import json, subprocess, sys
bad = []
for nb in subprocess.run(["git", "ls-files", "nbs/*.ipynb"], capture_output=True, text=True, check=True).stdout.split():
    cells = json.load(open(nb))["cells"]
    if any(c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count")) for c in cells):
        bad.append(nb)
if bad:
    print("check_clean: committed notebooks carry outputs:", *bad)
    sys.exit(1)
PY
$BIN/nbdev_export
$BIN/nbdev_clean
if ! git diff --quiet --exit-code; then
  echo "check_clean: nbdev_export / nbdev_clean change tracked files:"; git diff --stat; fail=1
fi
untracked=$(git ls-files --others --exclude-standard triage_cf nbs)
if [ -n "$untracked" ]; then echo "check_clean: nbdev_export creates untracked files: $untracked"; fail=1; fi
exit $fail
