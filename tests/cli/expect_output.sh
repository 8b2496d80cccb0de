#!/usr/bin/env bash
# expect_output.sh REGEX... -- CMD...: CMD must exit 0 (never hang) and its output (stdout and
# stderr) match every REGEX (extended, each on some line), with no error or internal error.
# EXPECT_RC=N expects exit code N instead of 0 (77: a test program that skips).
set -u
regexes=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do regexes+=("$1"); shift; done
[ $# -gt 1 ] || { echo "usage: expect_output.sh REGEX... -- CMD..." >&2; exit 2; }
shift
out=$(mktemp)
timeout 120 "$@" >"$out" 2>&1
rc=$?
bad=""
for r in "${regexes[@]}"; do grep -qE -e "$r" "$out" || bad+=" /$r/"; done
want=${EXPECT_RC:-0}
if [ "$rc" -ne "$want" ] || [ -n "$bad" ] || grep -qE '^strata: (error|internal error)' "$out"; then
  echo "FAIL: $*"
  echo "  exit $rc (expected $want); not matched:${bad:- none}"
  sed 's/^/  | /' "$out"
  rm -f "$out"
  exit 1
fi
echo "ok: $(grep -E -e "${regexes[0]}" "$out" | head -n 1)"
rm -f "$out"
