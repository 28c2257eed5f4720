"""What failed, from a CI log: the lines that say so, with the few lines after each (a panic's
message, an error's chain, pytest's assertion) and without backtrace frames. `.ci/run` prints
it last when it fails, since the tail of a CI log is often all a reader is shown, and a 50-frame
backtrace there had pushed the message itself out of view.

Usage: python3 scripts/ci-failures.py LOG [MAX_LINES]
"""

import re
import sys

# A lane's timestamp prefix, as scripts/test.sh writes it for the real node's lane.
LANE = r"^(?:\[node lane [\d:]+\] )?"
# A backtrace ends a block: its frames say where, the lines before it said what.
BACKTRACE = re.compile(LANE + r"\s*(?:[Ss]tack backtrace:|note: run with `RUST_BACKTRACE)")
SAYS_IT_FAILED = re.compile(
    LANE
    + r"(?:.*panicked at |Error: |FAILED |E   |---- .* stdout ----|test result: FAILED"
    + r"|error: test failed|\[test\] .*fail|=+ FAILURES =+|=+ short test summary)"
)
AFTER = 10


def failures(lines: list[str], budget: int) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(lines) and len(out) < budget:
        if not SAYS_IT_FAILED.search(lines[i]):
            i += 1
            continue
        block = [lines[i]]
        j = i + 1
        while j < len(lines) and not SAYS_IT_FAILED.search(lines[j]):
            if BACKTRACE.search(lines[j]):
                break
            if len(block) <= AFTER and re.sub(LANE, "", lines[j]).strip():
                block.append(lines[j])
            j += 1
        key = "\n".join(block)
        if key not in seen:
            seen.add(key)
            out.extend(line[:400] for line in block)
        i = j
    return out[:budget]


def main() -> int:
    path = sys.argv[1]
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else 120
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    found = failures(lines, budget)
    print(f"\n=== what failed (from {len(lines)} lines of this run's log) ===")
    print("\n".join(found) if found else "(no line of the log says which test failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
