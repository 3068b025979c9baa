#!/usr/bin/env bash
# Fuzzes every Go native fuzz target (func FuzzXxx(f *testing.F)) in the
# repository, one after the other, each for FUZZTIME: `go test -fuzz` takes
# one target of one package, so targets are discovered package by package
# (a target added anywhere is fuzzed without editing this script or the
# Makefile). Prints, per target, the executions and the inputs that found
# new coverage, and exits 1 when any target failed: its failing input is
# written to <package>/testdata/fuzz/<FuzzName>/, where plain `go test` (and
# so `make test`) runs it from then on — commit it with the fix.
#
# Usage: hack/fuzz.sh [package pattern...]   (default: ./...)
# Env:   FUZZTIME (default 10m; a duration, or Nx for N executions)
#        FUZZ     only targets whose name matches this regexp (default: all)
#        FUZZFLAGS extra go test flags, e.g. -parallel=2
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
fuzztime=${FUZZTIME:-10m}
filter=${FUZZ:-.}
read -r -a extra <<<"${FUZZFLAGS:-}"
[[ $# -gt 0 ]] || set -- ./...

# The targets, package by package, as their test files declare them
# (reading the source costs nothing; go test -list would build every
# package's tests first).
pkgs=()
declare -A targets
while read -r pkg d; do
	names=$(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(f \*testing\.F\).*/\1/p' "$d"/*_test.go 2>/dev/null | grep -E -- "$filter" | sort -u || true)
	if [[ -n $names ]]; then
		pkgs+=("$pkg")
		targets[$pkg]=$names
	fi
done < <($GO list -f '{{.ImportPath}} {{.Dir}}' "$@")
if [[ ${#pkgs[@]} -eq 0 ]]; then
	echo "fuzz: no fuzz target matching FUZZ=$filter in $*" >&2
	exit 1
fi

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
rows=()
failed=0
n=0
for pkg in "${pkgs[@]}"; do
	for target in ${targets[$pkg]}; do
		n=$((n + 1))
		out=$log/$n.log
		echo "fuzz: $target in $pkg for $fuzztime" >&2
		status=ok
		if ! $GO test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "${extra[@]}" "$pkg" >"$out" 2>&1; then
			status=FAILED
			failed=$((failed + 1))
			# The failure, and where its input was written.
			grep -E -- '--- FAIL|Error|panic|_test\.go:[0-9]+|Failing input written to|To re-run' "$out" | head -20 >&2 || true
		fi
		# The last progress line: "fuzz: elapsed: 1m0s, execs: 123 (2/sec),
		# new interesting: 4 (total: 56)".
		last=$(grep -E '^fuzz: elapsed: .*execs: ' "$out" | tail -1 || true)
		execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
		newc=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
		total=$(sed -nE 's/.*\(total: ([0-9]+)\).*/\1/p' <<<"$last")
		rows+=("$(printf '%-26s %-52s %12s %8s %8s  %s' "$target" "$pkg" "${execs:--}" "${newc:--}" "${total:--}" "$status")")
	done
done

printf '\n%-26s %-52s %12s %8s %8s  %s\n' target package execs new corpus result
printf '%s\n' "${rows[@]}"
if [[ $failed -gt 0 ]]; then
	echo "fuzz: $failed of $n targets failed; their inputs are under <package>/testdata/fuzz/<target>/ (commit each with its fix)" >&2
	exit 1
fi
echo "fuzz: $n targets, no failures" >&2
