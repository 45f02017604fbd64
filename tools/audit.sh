#!/bin/sh
# make audit: known vulnerabilities in every Go module (govulncheck), the TypeScript SDK's
# dependencies (npm audit) and the Python SDK's (pip-audit). A finding fails. Where a
# tool cannot reach its vulnerability database (an offline machine) it says so in one
# line and the audit goes on: the exit status is then 0 unless another tool found
# something. tools/audit_test.sh tests both paths with stand-in tools.
#
# Environment: GOVULNCHECK, NPM and PIP_AUDIT name the commands (the Makefile passes
# the pinned govulncheck and the SDK venv's pip-audit); GO_MODULES the Go modules.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
GOVULNCHECK=${GOVULNCHECK:-govulncheck}
NPM=${NPM:-npm}
PIP_AUDIT=${PIP_AUDIT:-pip-audit}
GO_MODULES=${GO_MODULES:-broker sdk-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failed=0

# unreachable reports whether the output in $out is a tool failing to reach its
# database (DNS, refused or timed-out connections, a registry without the audit API).
unreachable() {
	grep -Eqi 'no such host|dial tcp|connection refused|network is unreachable|i/o timeout|TLS handshake timeout|ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ENETUNREACH|audit endpoint returned an error|NameResolutionError|Failed to establish a new connection|Max retries exceeded|Temporary failure in name resolution|ConnectionError' "$out"
}

# check TOOL CMD...: runs CMD; 0 passes, a database out of reach is skipped with one
# line, anything else is a finding (or a broken tool) and fails the audit.
check() {
	tool=$1
	shift
	if "$@" >"$out" 2>&1; then
		echo "make audit: $tool: no known vulnerabilities"
		return
	fi
	if unreachable; then
		echo "make audit: $tool: vulnerability database not reachable; skipped"
		return
	fi
	cat "$out"
	echo "make audit: $tool: FAILED (see above)"
	failed=1
}

gv=""
for m in $GO_MODULES; do
	if (cd "$root/$m" && "$GOVULNCHECK" ./... >"$out" 2>&1); then
		continue
	fi
	if unreachable; then
		gv=skipped
		break # every module would fail alike
	fi
	cat "$out"
	echo "make audit: govulncheck: FAILED in $m (see above)"
	failed=1
	gv=failed
done
case $gv in
"") echo "make audit: govulncheck: no known vulnerabilities" ;;
skipped) echo "make audit: govulncheck: vulnerability database not reachable; skipped" ;;
esac

check "npm audit" sh -c "cd '$root/sdk-js' && '$NPM' audit --omit=dev"
# pip-audit goes into the Python SDK's venv on first use (it is not a test tool).
venv=$root/sdk-python/.venv/bin
if ! command -v "$PIP_AUDIT" >/dev/null 2>&1 && [ -x "$venv/python" ]; then
	if "$venv/python" -m pip install --quiet --disable-pip-version-check pip-audit==2.10.1 >"$out" 2>&1; then
		PIP_AUDIT=$venv/pip-audit
	elif unreachable; then
		PIP_AUDIT=""
		echo "make audit: pip-audit: vulnerability database not reachable; skipped"
	fi
fi
if [ -n "$PIP_AUDIT" ]; then
	check pip-audit sh -c "cd '$root/sdk-python' && '$PIP_AUDIT' --progress-spinner off ."
fi
exit $failed
