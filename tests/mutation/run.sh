#!/usr/bin/env bash
# Mutation testing of p2pfed's core paths (a developer's tool, not run in CI).
#
#   bash tests/mutation/run.sh [PATTERN ...]
#
# Installs the test and mutation extras, starts mutmut afresh (the mutants/ work folder is removed, so the
# results and the map of which test reaches which function come from the code and tests as they are now),
# mutates the files listed under [tool.mutmut] in pyproject.toml, runs each mutant against the fast tests of
# those paths, and prints the score per module (tests/mutation/score.py). PATTERNs select mutants by name,
# e.g. "p2pfed.influence*" or "p2pfed.node.learner.xǁLearningNodeǁrun*" (ǁ separates class and method); the
# default is every core path below. In node/learner.py and coordinator/server.py only the resume,
# checkpoint and round methods are mutated: the rest is exercised by the learning runs, minutes per mutant.
# MUTMUT_TESTS="tests/wire tests/net/test_membership.py" runs only those tests against the mutants (in a copy of
# the tree): a module's own unit tests, minutes instead of hours where the node and coordinator tests, which
# wait out real timeouts under many mutants, also reach the module.
# Exit code: score.py's (1 if a module is under 85 % or a survivor is neither killed nor accepted in
# tests/mutation/accepted.toml).
#
# How long, measured on the project's 2-core machine: the influence, learn, learner and coordinator patterns
# (about 850 mutants) took 58 min with MUTMUT_CHILDREN=1; the wire and membership patterns (about 1,080)
# took 12 min with 2 children against their unit tests (MUTMUT_TESTS above), but hours against the default
# selection, whose node and coordinator tests wait out timeouts under many of them. MUTMUT_CHILDREN (default 2) sets how many
# mutants run at once. A test that hangs under a mutant is stopped after MUTMUT_TEST_TIMEOUT seconds
# (default 60; pyproject's 300 would make each hanging mutant cost minutes) and counts as killed.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEFAULT_PATTERNS=(
  "p2pfed.wire*"
  "p2pfed.net.membership*"
  "p2pfed.influence*"
  "p2pfed.learn.train*"
  "p2pfed.learn.checkpoint*"
  "p2pfed.node.learner.xǁLearningNodeǁrestore*"
  "p2pfed.node.learner.xǁLearningNodeǁcheckpoint*"
  "p2pfed.node.learner.xǁLearningNodeǁrun*"  # run and run_round
  "p2pfed.coordinator.server.xǁCoordinatorǁrestore*"
  "p2pfed.coordinator.server.xǁCoordinatorǁcheckpoint*"
  "p2pfed.coordinator.server.xǁCoordinatorǁrun__*"  # run, not run_round
)
if [ "$#" -eq 0 ]; then
  set -- "${DEFAULT_PATTERNS[@]}"
fi

python3 -m pip install -q -e '.[test,mutation]'
if [ -n "${MUTMUT_TESTS:-}" ]; then
  # Only these tests run against the mutants (e.g. a module's own unit tests): in a copy of the tree whose
  # pyproject names them, so this tree's settings stay as they are. The results stay in the copy.
  copy=$(mktemp -d /tmp/p2pfed-mutation.XXXXXX)
  tar --exclude=./mutants --exclude=./.git --exclude=./runs -cf - . | tar -xf - -C "$copy"
  cd "$copy"
  python3 - "$MUTMUT_TESTS" <<'PY'
import re, sys
from pathlib import Path
tests = ", ".join(f'"{t}"' for t in sys.argv[1].split())
p = Path("pyproject.toml")
p.write_text(re.sub(r"pytest_add_cli_args_test_selection = \[[^\]]*\]",
                    f"pytest_add_cli_args_test_selection = [{tests}]", p.read_text()))
PY
  echo "mutating in $copy, against: $MUTMUT_TESTS"
fi
rm -rf mutants
start=$(date +%s)
# --timeout-method=thread: a mutant that hangs in libzmq's teardown (a C call no signal interrupts) ends the
# test process at the timeout instead of holding a worker for as long as mutmut's CPU-time limit never comes.
PYTEST_ADDOPTS="--timeout=${MUTMUT_TEST_TIMEOUT:-60} --timeout-method=thread ${PYTEST_ADDOPTS:-}" \
  python3 -m mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@"
echo "mutmut ran for $(( ($(date +%s) - start) / 60 )) min"
python3 tests/mutation/score.py
