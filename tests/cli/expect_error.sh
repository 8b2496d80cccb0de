#!/usr/bin/env bash
# expect_error.sh CODE REGEX CMD...: CMD must exit with CODE (never hang or crash) and print
# exactly one "strata: error:" line on stderr, matching REGEX, and no internal error.
set -u
code=$1 regex=$2
shift 2
err=$(mktemp)
timeout 120 "$@" >/dev/null 2>"$err"
rc=$?
lines=$(grep -c '^strata: error:' "$err")
if [ "$rc" -ne "$code" ] || [ "$lines" -ne 1 ] || ! grep -qE -e "$regex" "$err" || grep -q 'internal error' "$err"; then
  echo "FAIL: $*"
  echo "  exit $rc (expected $code), $lines error line(s) (expected 1 matching /$regex/):"
  sed 's/^/  | /' "$err"
  exit 1
fi
echo "ok: exit $rc: $(grep '^strata: error:' "$err")"
rm -f "$err"
