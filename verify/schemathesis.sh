#!/usr/bin/env bash
# Runs schemathesis (from PyPI, installed into verify/.venv) against openapi.yaml and a
# live narad on a free loopback port with a fresh data directory: every response must be
# no 5xx, conform to the spec (status, content type, headers, body schema), and every
# input the spec forbids must be rejected. Stateful chains (create topic → produce →
# consume → ack) come from the links that dependency analysis infers.
#
#   verify/schemathesis.sh quick   # make test: a short run (about a minute)
#   verify/schemathesis.sh full    # make chaos: longer, every phase, more examples
#
# Failing runs keep the report (JUnit, NDJSON) and the node log in the directory printed
# at the end.
set -euo pipefail
mode=${1:-quick}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=$here/.venv
# Exact versions, so a new release cannot change what a run means; the venv is rebuilt
# when the list changes.
reqs=$here/schemathesis-requirements.txt
if ! cmp -s "$reqs" "$venv/requirements.txt" 2>/dev/null; then
	rm -rf "$venv"
	python3 -m venv "$venv"
	"$venv/bin/pip" install -q -r "$reqs"
	cp "$reqs" "$venv/requirements.txt"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/narad-schemathesis-XXXXXX")
bin=$work/narad
(cd "$root/broker" && go build -o "$bin" ./cmd/narad)
port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --http-addr "127.0.0.1:$port" --data-dir "$work/data" --log-level warn --shutdown-grace 2s >"$work/node.log" 2>&1 &
pid=$!
stop() { kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 1 300); do
	if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then break; fi
	kill -0 "$pid" 2>/dev/null || { echo "narad exited; see $work/node.log"; exit 1; }
	sleep 0.1
done

case $mode in
quick) args=(--max-examples 25 --max-time 90 --phases examples,coverage,fuzzing,stateful) ;;
full) args=(--max-examples 400 --max-time 1500 --phases examples,coverage,fuzzing,stateful) ;;
*) echo "usage: $0 quick|full"; exit 2 ;;
esac
status=0
# One worker: with two threads, hypothesis parses lambda sources concurrently and
# CPython 3.11 can fail with "AST constructor recursion depth mismatch" (a runtime error
# of the tool, not a finding about narad).
(cd "$here" && "$venv/bin/schemathesis" --config-file "$here/schemathesis.toml" run "$root/openapi.yaml" \
	--url "http://127.0.0.1:$port" --workers 1 --seed "${SCHEMATHESIS_SEED:-1}" \
	--report junit,ndjson --report-dir "$work/report" --no-color "${args[@]}") || status=$?
stop
trap - EXIT
if [ $status -ne 0 ]; then
	echo "schemathesis found problems; report and node log kept in $work"
	exit $status
fi
rm -rf "$work"
echo "schemathesis: passed"
