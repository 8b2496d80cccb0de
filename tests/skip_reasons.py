#!/usr/bin/env python3
"""Why each test of the last ctest run did not run: one line per skipped test with its reason.

    skip_reasons.py [BUILD_DIR]     (default: build)

Reads BUILD_DIR/Testing/Temporary/LastTest.log, ctest's log of the last run: each test's
command, output and result. A test skips in one of two ways, and says why on a line of its
output that starts with "skipped:" or "SKIPPED:" (any case; STRATA_SKIP in the Catch2 tests,
tests/support/skip.h, prints "SKIPPED: <reason>"):
  - it exits 77 (SKIP_RETURN_CODE). LastTest.log records such a test as "Test Passed.", so the
    exit status comes from the JUnit file of the same run, when there is one:
    BUILD_DIR/Testing/Temporary/LastTest.junit.xml (./dev test asks ctest for it with
    --output-junit). Without it, a test whose output ends in a "skipped:" line is counted.
  - its output matches its SKIP_REGULAR_EXPRESSION (LastTest.log says so).
A skipped test that printed no such line is listed with "(no reason printed)": each test that
skips must say why.

Also listed: tests that passed while skipping a part of what they check (a "skipped:" line in a
passing test's output, e.g. the bad-input corpus without prlimit): they ran, but not all of it.

Exit status 0, whatever it finds (./dev test exits with ctest's status, not this script's);
2 where there is no LastTest.log.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

SKIP_LINE = re.compile(r"^\s*(?:\S.*?:\s+)?skipped\b\s*[:(]", re.IGNORECASE)


def blocks(log_text):
    """(name, output, result) per test of LastTest.log; result is the line after the output's
    closing rule ("Test Passed.", "Test Failed.", "Test Pass Reason:" for a skip by regex)."""
    pattern = re.compile(
        r'^\d+/\d+ Test: (?P<name>.*?)\n.*?^Output:\n-+\n(?P<out>.*?)<end of output>\n'
        r'Test time =[^\n]*\n-+\n(?P<result>[^\n]*)\n(?P<more>[^\n]*)',
        re.MULTILINE | re.DOTALL)
    for m in pattern.finditer(log_text):
        yield m.group("name"), m.group("out"), m.group("result") + "\n" + m.group("more")


def junit_skips(path, log_path, names):
    """Tests the JUnit file of the same run says were skipped, or None where there is no such
    file (absent, older than the log, or of another run)."""
    if not os.path.exists(path) or os.path.getmtime(path) < os.path.getmtime(log_path) - 5:
        return None
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except ET.ParseError:
        return None
    skipped = set()
    for case in cases:
        name = case.get("name")
        if name not in names:
            return None  # another run's file
        if case.find("skipped") is not None:
            skipped.add(name)
    return skipped


def reasons(output):
    return [l.strip() for l in output.splitlines() if SKIP_LINE.match(l)]


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    log_path = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(log_path):
        print(f"skip_reasons.py: no {log_path} (run ctest first)", file=sys.stderr)
        return 2
    with open(log_path, errors="replace") as f:
        tests = list(blocks(f.read()))
    names = {name for name, _, _ in tests}
    by_junit = junit_skips(os.path.join(build, "Testing", "Temporary", "LastTest.junit.xml"),
                           log_path, names)

    skipped, partly = [], []
    for name, out, result in tests:
        why = reasons(out)
        lines = [l for l in out.splitlines() if l.strip()]
        if "Skip regular expression found in output" in result:
            is_skip = True
        elif by_junit is not None:
            is_skip = name in by_junit
        else:  # exit 77 cannot be told from LastTest.log: a last line "skipped: ..." stands for it
            is_skip = result.startswith("Test Passed.") and bool(lines) and \
                bool(SKIP_LINE.match(lines[-1]))
        if is_skip:
            skipped.append((name, why))
        elif why and result.startswith("Test Passed."):
            partly.append((name, why))

    source = "" if by_junit is not None else \
        " (no JUnit file of this run: tests that exited 77 are counted by their last line)"
    print(f"skipped tests: {len(skipped)}{source}")
    for name, why in skipped:
        print(f"  {name}: {'; '.join(why) if why else '(no reason printed)'}")
    if partly:
        print(f"passed, with parts skipped: {len(partly)}")
        for name, why in partly:
            print(f"  {name}: {'; '.join(why)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
