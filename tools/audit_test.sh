#!/bin/sh
# Tests tools/audit.sh with stand-in tools (seconds, no network): with every database
# out of reach (the tools' own error texts) it prints one line per tool and exits 0; a
# real finding fails it. Run by make test-audit.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "audit_test: $*"; exit 1; }

# Stand-ins printing what each tool printed on a machine without network access.
cat >"$dir/govulncheck-offline" <<'X'
#!/bin/sh
echo 'govulncheck: fetching vulnerabilities: Get "https://vuln.go.dev/index/modules.json.gz": dial tcp: lookup vuln.go.dev on 10.255.255.53:53: no such host' >&2
exit 1
X
cat >"$dir/npm-offline" <<'X'
#!/bin/sh
echo 'npm warn audit 405 Method Not Allowed - POST https://registry.npmjs.org/-/npm/v1/security/advisories/bulk' >&2
echo 'npm error audit endpoint returned an error' >&2
exit 1
X
cat >"$dir/pip-audit-offline" <<'X'
#!/bin/sh
echo "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded with url: /pypi/requests/json (Caused by NameResolutionError(\"Failed to resolve 'pypi.org'\"))" >&2
exit 1
X
cat >"$dir/govulncheck-finding" <<'X'
#!/bin/sh
echo 'Vulnerability #1: GO-2024-0001'
echo 'Your code is affected by 1 vulnerability from 1 module.'
exit 3
X
cat >"$dir/ok" <<'X'
#!/bin/sh
exit 0
X
chmod +x "$dir"/*

run() { GO_MODULES="broker sdk-go" "$here/audit.sh" >"$dir/out" 2>&1; }

# Every database out of reach: exit 0, one line per tool.
if ! GOVULNCHECK="$dir/govulncheck-offline" NPM="$dir/npm-offline" PIP_AUDIT="$dir/pip-audit-offline" run; then
	cat "$dir/out"; fail "offline: exit status not 0"
fi
for tool in govulncheck "npm audit" pip-audit; do
	n=$(grep -c "^make audit: $tool: vulnerability database not reachable; skipped\$" "$dir/out" || true)
	[ "$n" = 1 ] || { cat "$dir/out"; fail "offline: $n skip lines for $tool, want 1"; }
done
[ "$(wc -l <"$dir/out")" -eq 3 ] || { cat "$dir/out"; fail "offline: want exactly 3 lines"; }

# A finding fails the audit, even with the other databases out of reach.
if GOVULNCHECK="$dir/govulncheck-finding" NPM="$dir/npm-offline" PIP_AUDIT="$dir/ok" run; then
	cat "$dir/out"; fail "a finding: exit status 0"
fi
grep -q "GO-2024-0001" "$dir/out" || fail "a finding: the finding is not shown"
grep -q "^make audit: govulncheck: FAILED" "$dir/out" || fail "a finding: no FAILED line"

# All clean: exit 0.
GOVULNCHECK="$dir/ok" NPM="$dir/ok" PIP_AUDIT="$dir/ok" run || { cat "$dir/out"; fail "clean: exit status not 0"; }
echo "audit_test: ok"
