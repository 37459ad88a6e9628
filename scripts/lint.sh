#!/usr/bin/env bash
# The static checks, both failing the run when unclean; scripts/test.sh runs them before the tests.
#   ruff   pyproject.toml's [tool.ruff] over the checkout (no formatter: the code is formatted by hand)
#   mypy   pyproject.toml's [tool.mypy] over all package code: src/ortlstm, ops/ and graphs/
# The tools are the `lint` extra's pinned versions, in the environment of $LINT_PYTHON (default: the
# infer environment scripts/test.sh makes). Usage: bash scripts/lint.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${LINT_PYTHON:-$root/.venvs/infer/bin/python}"

status=0
"$python" -m ruff check . || status=1

# ops/ and graphs/ install as ortlstm.ops and ortlstm.graphs (pyproject.toml's wheel.packages), which
# an editable install maps with an import hook that mypy does not follow: mypy reads the package from
# build/typecheck/ortlstm, links laid out as the wheel installs them, and its messages name the
# checkout's files again.
tree="$root/build/typecheck/ortlstm"
rm -rf "$tree"
mkdir -p "$tree"
for entry in "$root"/src/ortlstm/*; do
  case "$(basename "$entry")" in
    ops | graphs | __pycache__) ;;  # a development checkout may link ops/ and graphs/ here
    *) ln -s "$entry" "$tree/" ;;
  esac
done
ln -s "$root/ops" "$tree/ops"
ln -s "$root/graphs" "$tree/graphs"
"$python" -m mypy |
  sed -e 's#^build/typecheck/ortlstm/\(ops\|graphs\)/#\1/#' -e 's#^build/typecheck/ortlstm/#src/ortlstm/#' || status=1
exit "$status"
