# floe's bridge to the `swebench` package (embedded in the floe binary, run as `python -I -c`).
# Reads one JSON request on stdin, writes one JSON answer on stdout:
#   {"do": "script", "instance": {...}}          -> {"eval_script": "..."}
#   {"do": "grade", "instance": {...}, "log": "", "baseline": {statuses}?, "statuses": bool?}
#       -> {"report": {...}, "f2p": x, "p2p": y, "p2p_skipped": [...], "statuses": {...}?, ...}
# or {"error": "..."} when swebench cannot do it (not installed, an unknown log parser).
# Everything that decides a verdict is swebench's own: its TestSpec (which makes the eval script
# record the test command's exit status), its log parsers and its report.
import json
import os
import re
import shlex
import sys
import tempfile

# The answer's own channel: some of swebench's parsers print (maven's warns of a test with no
# BUILD line, on every line fed alone below), and stdout must hold the answer only.
ANSWER = sys.stdout
sys.stdout = sys.stderr


def answer(value):
    json.dump(value, ANSWER)
    ANSWER.write("\n")
    ANSWER.flush()


# unittest's failure summary, `FAIL: test_x (m.C)` (Python 3.11 on: `(m.C.test_x)`), which
# swebench's Django parser files under `test_x` alone.
UNITTEST_SUMMARY = re.compile(r"^(?:FAIL|ERROR): (\S+) \(([^()\s]+)\)")
# sympy's failure header, `___ sympy/core/tests/test_x.py:test_foo ___`, which its parser files
# under the path while the instances' lists name `test_foo` alone.
SYMPY_HEADER = re.compile(r"^_+ \S+\.py:(\S+) _+$")


# Parsers that pair a test with a later result line, swebench's patterns: maven's names each
# test by its run's command (`mvn test -Dtest=X`, set -x) and pairs the runs, in order, with the
# `BUILD SUCCESS|FAILURE` lines after them.
PAIRED_RESULTS = {
    "parse_log_maven": (
        re.compile(r"^.*-Dtest=(\S+).*$"),
        re.compile(r"^.*BUILD (SUCCESS|FAILURE)$"),
    ),
}


def forged_pairing(parser_name, log):
    """The tests a paired parser's log runs, when it holds more result lines than runs: each
    run prints one, so the others were printed by the code under test (`BUILD SUCCESS` during a
    failing test takes that test's place in the pairing, and maven's own `BUILD FAILURE` falls
    to the next run or to none). Such a pairing cannot be trusted: every test it runs fails."""
    patterns = PAIRED_RESULTS.get(parser_name)
    if patterns is None:
        return set()
    run, result = patterns
    runs, results = [], 0
    for line in log.split("\n"):
        named = run.match(line.strip())
        if named:
            runs.append(named.group(1))
        if result.match(line.strip()):
            results += 1
    return set(runs) if results > len(runs) else set()


# pytest's tally, its last line: `=== 2 passed, 1 skipped in 0.12s ===` (`-q`: no `=`s; before
# pytest 5, `in 0.12 seconds`, a duration code under test can make negative by setting
# `time.time`), colour codes aside. `2 subtests passed` is no `passed` count.
PYTEST_TALLY = re.compile(
    r"^=*\s*(?P<parts>(?:\d+ [a-z ]+?)(?:, \d+ [a-z ]+?)*|no tests ran)"
    r" in -?[0-9.]+ ?(?:s|seconds)(?: \([^()]*\))?\s*=*$"
)
# A line shaped as a tally that PYTEST_TALLY does not read: a tally of no passes.
TALLY_LIKE = re.compile(r"^=+ .*\b(?:passed|failed|skipped|errors?|no tests ran)\b.* =+$")
TALLY_PART = re.compile(r"(?:^|, )(\d+) ([a-z ]+?)(?=,|$)")
# What a tally counts as tests (a test with a failed teardown is counted twice: more, never
# fewer).
TALLIED = {"passed", "failed", "skipped", "xfailed", "xpassed", "error", "errors", "deselected"}
COLLECTED = re.compile(r"^(?:collecting \.\.\. )?collected (\d+) items?\b(.*)$")
# `collected 0 items / 1 skipped`: a module skipped as it was collected, a test the tally counts.
COLLECTED_SKIPPED = re.compile(r"/ (\d+) skipped\b")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def test_commands(spec, start, end):
    """The commands the eval script runs between swebench's markers (SWE-bench's instances
    run one: one test run, so one tally). The script is the instance's, not the log."""
    inside, commands = False, []
    for line in spec.eval_script_list:
        if start in line:
            inside = True
        elif end in line:
            break
        elif inside and line.strip() and not line.strip().startswith("#"):
            # swebench's own line recording the command's status is no command.
            if not line.strip().startswith("SWEBENCH_TEST_EXIT_CODE="):
                commands.append(line.strip())
    return commands


def run_paths(command):
    """The test files and directories a test command names (`pytest -rA tests/test_x.py`,
    `tox -epy39 -- tests/test_y.py::test_z`): its arguments that look like paths."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    return [
        w.split("::")[0].rstrip("/")
        for w in words[1:]
        if not w.startswith("-") and ("/" in w or w.split("::")[0].endswith(".py"))
    ]


def in_run(key, paths):
    """Whether a result's id names a test of the run's paths (not a pytester run's)."""
    path = key.split("::")[0]
    return "::" in key and any(path == p or path.startswith(p + "/") for p in paths)


def tally_counts(line):
    """`(passed, tests, errors)` of a tally line (`tests` without errors, which may count a
    test twice: a teardown's), else None; a line shaped as one that does not read is
    `(0, 0, 0)`."""
    tally = PYTEST_TALLY.match(line)
    if not tally:
        return (0, 0, 0) if TALLY_LIKE.match(line) else None
    parts = TALLY_PART.findall(tally.group("parts"))
    count = lambda words: sum(int(n) for n, word in parts if word in words)  # noqa: E731
    return count({"passed"}), count(TALLIED - {"error", "errors"}), count({"error", "errors"})


def counts_the_run(counts, collected):
    """Whether a tally counts every test `collected` (`collected N items` and what it adds):
    each has one outcome, and an error may be a test's own or a second one."""
    _, tests, errors = counts
    return collected is not None and tests <= collected <= tests + errors


def unvouched_passes(parser, log, spec, paths):
    """For a pytest run, passes its tally does not account for: `None` when it does, else
    (`"no tally"` or `"forged"`, why).

    pytest prints one `PASSED <id>` line per passing test (`-rA`) and then a tally that
    counts them; code under test that skips the test it fails and prints `PASSED <id>` for it
    (pytest's skip summary names no test) adds a pass the tally lacks. Counted: the `PASSED`
    lines from the summary block that holds the first listed test's `PASSED` line on (each
    line once: two ids a parser cuts to one name are two tests), and the listed tests reported
    passed only before it (verbose progress lines). Before that block come the captured
    output of pytest's own tests, whose pytester runs print sessions of their own (passes,
    tallies, and `PASSED [ 50%]`, which some instances' lists hold as a test: only names with
    `::` are tests here). The tallies they are held to: every one after that block (the code
    under test can print a tally of its own after pytest's, never take pytest's back), and
    the last one before that block when it counts the whole run (`collected N items`, printed
    before any test runs): pytest's own, where every pass was forged after it."""
    listed = [n for n in spec.FAIL_TO_PASS + spec.PASS_TO_PASS if "::" in n]
    lines = [COLOUR.sub("", line) for line in log.split("\n")]
    reports = []
    for raw, line in zip(log.split("\n"), lines):
        passed = set()
        # As swebench reads the line, and without its colour codes.
        for text in (raw, line):
            try:
                statuses = parser(text, spec) or {}
            except Exception:  # noqa: BLE001 - a line the parser refuses reports nothing
                statuses = {}
            passed.update(k for k, v in statuses.items() if v == "PASSED")
        reports.append(passed)
    claims = [i for i, passed in enumerate(reports) if any(names_one_of(k, listed) for k in passed)]
    if not claims:
        return None
    # The summary block: where the first `PASSED` line of a test of the run's paths is (an
    # unlisted test's, when the listed ones' passes are all forged), else of a listed test.
    summary = [
        i
        for i in range(len(lines))
        if lines[i].startswith("PASSED ")
        and any(in_run(k, paths) or names_one_of(k, listed) for k in reports[i])
    ]
    anchor = (summary or claims)[0]
    while anchor > 0 and reports[anchor - 1]:
        anchor -= 1
    first = next((m for m in map(COLLECTED.match, lines) if m), None)
    collected = None
    if first:
        collected = int(first.group(1)) + sum(map(int, COLLECTED_SKIPPED.findall(first.group(2))))
    tallies = [c[0] for c in map(tally_counts, (x.strip() for x in lines[anchor:])) if c]
    # The last tally before the block, when it counts the whole run: pytest's own, where the
    # first pass was forged after it (an instance with no PASS_TO_PASS whose only test is
    # skipped). Not the ones before it: pytester's sessions in the captured output.
    before = [c for c in map(tally_counts, (x.strip() for x in lines[:anchor])) if c]
    if before and counts_the_run(before[-1], collected):
        tallies.append(before[-1][0])
    if not tallies or not any(tally_counts(x.strip()) for x in lines[anchor:]):
        return "no tally", "pytest's tally never follows the passes the log reports"
    summary_lines = [
        i for i in range(anchor, len(lines)) if lines[i].startswith("PASSED ") and reports[i]
    ]
    named = {k for i in summary_lines for k in reports[i]}
    earlier = {k for i in claims for k in reports[i] if names_one_of(k, listed)} - named
    counted = len(summary_lines) + len(earlier)
    if counted > min(tallies):
        return "forged", (
            f"the log reports {counted} tests passed, pytest's tally {min(tallies)}: "
            "passes printed beside pytest's own"
        )
    return None


def reported_passed(parser, log, spec):
    """The tests swebench's reading of the log, or of one of its lines, reports passed."""
    passed = set()
    for text in [log] + log.split("\n"):
        try:
            passed.update(k for k, v in (parser(text, spec) or {}).items() if v == "PASSED")
        except Exception:  # noqa: BLE001 - a line the parser refuses reports nothing
            continue
    return passed


def passes_past(parser, log, spec, allowances, tally):
    """Why the tests the log reports passed are more than the least of `allowances` (its
    runner's tallies, named `tally` in the reason), else `None`; `None` too without a tally,
    nothing to hold them to."""
    if not allowances:
        return None
    passed = reported_passed(parser, log, spec)
    if len(passed) > min(allowances):
        return "forged", (
            f"the log reports {len(passed)} tests passed, {tally} {min(allowances)}: "
            "passes printed beside the runner's own"
        )
    return None


# unittest's tally (Django's runner): `Ran 5 tests in 0.123s`, then `OK (skipped=1)` or
# `FAILED (failures=1, skipped=2, expected failures=1)`.
UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in -?[0-9.]+s$")
UNITTEST_RESULT = re.compile(r"^(?:OK|FAILED)(?: \((?P<parts>[a-z =0-9,]*)\))?$")


def unvouched_unittest_passes(parser, log, spec):
    """For a unittest run (Django's), passes its tally does not account for: `None` when it
    does, else why. A test the code under test skips (its runner's `skipped` on a line of its
    own after output it printed, which names no test) and then reports `ok` for (a line it
    prints) passes in swebench's reading; the tally counts the skip. Each tally (`Ran N`, then
    its result line) allows N less the skipped and expected failures; the smallest counts (the
    code under test can print one of its own after the runner's, never take that back).
    Failures and errors are not taken off: subtests count one each, and a failure's own
    summary line already fails its test."""
    lines = [line.strip() for line in log.split("\n")]
    allowed = []
    for at, line in enumerate(lines):
        ran = UNITTEST_RAN.match(line)
        if not ran:
            continue
        result = next((m for m in map(UNITTEST_RESULT.match, lines[at + 1 : at + 4]) if m), None)
        if result is None:
            continue
        parts = dict(
            (k.strip(), int(v))
            for k, v in (
                p.split("=", 1) for p in (result.group("parts") or "").split(",") if "=" in p
            )
            if v.strip().isdigit()
        )
        off = parts.get("skipped", 0) + parts.get("expected failures", 0)
        allowed.append(int(ran.group(1)) - off)
    return passes_past(parser, log, spec, allowed, "unittest's tally allows")


# sympy's runner's tally, centred in `=`s: `=== tests finished: 5 passed, 1 skipped, in 0.10
# seconds ===` (its first line: the runner wraps a long one).
SYMPY_TALLY = re.compile(r"^=*\s*tests finished: (\d+) passed,")


def unvouched_sympy_passes(parser, log, spec):
    """For sympy's runner (`bin/test`), passes its tally does not account for: `None` when it
    does, else why. A test the code under test skips prints no result swebench's parser
    reads, so a `test_foo ok` it prints is the test's only one; the tally counts passes
    alone. The smallest tally counts (one the code under test prints can only lower it)."""
    tallies = [int(m.group(1)) for m in map(SYMPY_TALLY.match, log.split("\n")) if m]
    return passes_past(parser, log, spec, tallies, "sympy's tally")


def pytest_family(parser):
    """Whether `parser` reads pytest's output (swebench's pytest parsers and their aliases)."""
    from swebench.harness.log_parsers import python

    names = (
        "parse_log_pytest",
        "parse_log_pytest_options",
        "parse_log_pytest_v2",
        "parse_log_seaborn",
        "parse_log_matplotlib",
    )
    return any(parser is getattr(python, n, None) for n in names)


def tested_section(parser, log, spec, start, end):
    """The part of the log swebench reads results from (`get_logs_eval`): between its markers,
    or the whole log when that part reports none. What the eval script prints before the tests
    (`git show`: the base commit's message) is no test's result."""
    if start in log and end in log:
        sliced = log.split(start)[1].split(end)[0]
        try:
            if parser(sliced, spec):
                return sliced
        except Exception:  # noqa: BLE001 - swebench would fall back to the whole log too
            pass
    return log


def reported_failing(parser, log, spec):
    """The tests some line of the log reports failing (and, for unittest's summary lines,
    under the `name (Class)` key result lines use before Python 3.11 and the
    `name (Class.name)` one they use since), and the `FAIL_TO_PASS` tests some line reports
    skipped or expected to fail (a pass the code under test prints after it would otherwise
    be the test's last word), sorted."""
    failing = set()
    lines = log.splitlines()
    for at, line in enumerate(lines):
        summary = UNITTEST_SUMMARY.match(line.strip())
        if summary:
            name, where = summary.groups()
            failing.add(f"{name} ({where})")
            failing.add(f"{name} ({where.removesuffix('.' + name)})")
            # A test with a docstring: unittest gives its first line under the summary, the
            # name Django's parser (and so the instance's lists) know the test by.
            following = lines[at + 1].strip() if at + 1 < len(lines) else ""
            if following and not following.startswith(("---", "===", "Traceback")):
                failing.add(following)
        header = SYMPY_HEADER.match(line.strip())
        if header:
            failing.add(header.group(1))
        try:
            statuses = parser(line, spec) or {}
        except Exception:  # noqa: BLE001 - a parser that needs more than one line
            continue
        failing.update(
            n
            for n, status in statuses.items()
            if status in ("FAILED", "ERROR")
            or (status in ("XFAIL", "SKIPPED") and names_one_of(n, spec.FAIL_TO_PASS))
        )
    return sorted(failing)


def p2p_skipped_or_expected_to_fail(parser, log, spec):
    """The `PASS_TO_PASS` tests (by their lists' names) that swebench's reading of the log, or
    of one of its lines, reports `XFAIL` or skipped: a line the code under test prints after
    (Django's parser takes an `ok` for the last test named) does not take that back."""
    readings = []
    for text in [log] + log.split("\n"):
        try:
            readings.append(parser(text, spec) or {})
        except Exception:  # noqa: BLE001 - a line the parser refuses reports nothing
            continue
    keys = {k for r in readings for k, v in r.items() if v in ("XFAIL", "SKIPPED")}
    return {n for n in spec.PASS_TO_PASS if any(names_one_of(k, [n]) for k in keys)}


def passed_in(name, statuses):
    """Whether test `name` of a list passed in `statuses` (every key it names, for a truncated
    name)."""
    keys = [k for k in statuses if names_one_of(k, [name])]
    return bool(keys) and all(statuses[k] == "PASSED" for k in keys)


def names_one_of(key, names):
    """Whether status key `key` is one of `names`' tests (exactly, or one a truncated name
    begins)."""
    return any(key == n or (n.count("[") > n.count("]") and key.startswith(n)) for n in names)


def main():
    request = json.load(sys.stdin)
    try:
        import swebench
        from swebench.harness.grading import (
            compute_fail_to_pass,
            compute_pass_to_pass,
            get_eval_report,
        )
        from swebench.harness.constants import (
            END_TEST_OUTPUT,
            START_TEST_OUTPUT,
            TestStatus,
        )
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.utils import make_test_spec
    except Exception as e:  # noqa: BLE001 - any import failure is the same answer
        return answer({"error": f"the swebench package does not import here: {e!r}"})
    instance = request["instance"]
    if instance["log_parser"] not in PARSER_REGISTRY:
        return answer(
            {
                "error": f"swebench {swebench.__version__} has no log parser "
                f"{instance['log_parser']!r}"
            }
        )
    spec = make_test_spec(instance)
    if request["do"] == "script":
        return answer({"eval_script": spec.eval_script})
    # The code under test runs in the test runner's process and can print result lines of its
    # own (an atexit hook printing "PASSED <test>" after the real summary, then exiting 0).
    # swebench lets a test's last report win, over the whole log (Django's parser also takes an
    # "ok" line for the last test it saw): a test that any line reports failing counts here as
    # failed, so a forged pass never outweighs the runner's failure. Honest logs report a
    # test failing where it also passes only when it fails somewhere (pytest -rA: a teardown
    # error is PASSED and ERROR; jest: one title in two files): that fails the test, never the
    # whole log.
    parser = PARSER_REGISTRY[instance["log_parser"]]
    tested = tested_section(parser, request["log"], spec, START_TEST_OUTPUT, END_TEST_OUTPUT)
    failing = sorted(
        set(reported_failing(parser, tested, spec)) | forged_pairing(instance["log_parser"], tested)
    )
    # Passes pytest's tally does not account for: none of the log's passes can be told from
    # the code under test's, so none is believed; without a tally after them, no results.
    doubt = None
    commands = test_commands(spec, START_TEST_OUTPUT, END_TEST_OUTPUT)
    if pytest_family(parser) and len(commands) == 1:
        doubt = unvouched_passes(parser, tested, spec, run_paths(commands[0]))
    if instance["log_parser"] == "parse_log_django" and len(commands) == 1:
        doubt = unvouched_unittest_passes(parser, tested, spec)
    if instance["log_parser"] == "parse_log_sympy" and len(commands) == 1:
        doubt = unvouched_sympy_passes(parser, tested, spec)
    listed = spec.FAIL_TO_PASS + spec.PASS_TO_PASS
    # swebench counts a PASS_TO_PASS test kept when it is XFAIL (as the repository's own
    # xfail-marked tests are) or skipped (as the environment may skip it). When the code under
    # test made it so, it is a regression: told by the untouched repository's log (the same
    # eval script on the base commit, `baseline`), where such a test passed.
    # `baseline`: swebench's reading of that log (`statuses` of its grading), by test key.
    skipped_p2p = p2p_skipped_or_expected_to_fail(parser, tested, spec)
    base = request.get("baseline")
    regressed = {n for n in skipped_p2p if passed_in(n, base)} if isinstance(base, dict) else set()

    # swebench counts an expected failure (XFAIL) as a pass. A FAIL_TO_PASS test passes after
    # a fix; one that "xfails" is one the code under test told the runner to expect failing
    # (`pytest.xfail()` called where it fails): it is failed here.
    def strict(log, test_spec):
        if doubt and doubt[0] == "no tally":
            return {}
        statuses = parser(log, test_spec)
        if statuses:
            if doubt:
                for key, status in list(statuses.items()):
                    if status == TestStatus.PASSED.value and names_one_of(key, listed):
                        statuses[key] = TestStatus.FAILED.value
            for name in failing + sorted(regressed):
                statuses[name] = TestStatus.FAILED.value
            for key in list(statuses):
                if names_one_of(key, regressed):
                    statuses[key] = TestStatus.FAILED.value
            for key, status in list(statuses.items()):
                if status == TestStatus.XFAIL.value and names_one_of(key, spec.FAIL_TO_PASS):
                    statuses[key] = TestStatus.FAILED.value
        return statuses

    PARSER_REGISTRY[instance["log_parser"]] = strict
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "test_output.txt")
        with open(log, "w") as f:
            f.write(request["log"])
        prediction = {
            "instance_id": spec.instance_id,
            "model_name_or_path": "floe",
            "model_patch": "",
        }
        report = get_eval_report(spec, prediction, log, include_tests_status=True)
    report = report[spec.instance_id]
    tests = report.get("tests_status")
    answer(
        {
            "version": swebench.__version__,
            "report": report,
            "failing": failing,
            "doubt": doubt[1] if doubt else None,
            "p2p_skipped": sorted(skipped_p2p),
            "p2p_regressed": sorted(regressed),
            # swebench's own reading of the log (asked for the untouched repository's).
            "statuses": parser(tested, spec) if request.get("statuses") else None,
            "f2p": compute_fail_to_pass(tests) if tests else None,
            "p2p": compute_pass_to_pass(tests) if tests else None,
        }
    )


main()
