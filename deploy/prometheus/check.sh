#!/usr/bin/env bash
# check.sh: `make prometheus-rules`. promtool checks the alert rules and runs
# their unit tests; then every fan_* metric the rules and the Grafana
# dashboard query must be one the Go code registers, so a renamed metric
# cannot leave an alert that never fires or an empty panel.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
command -v promtool >/dev/null || { echo "check.sh: promtool not found (Debian package prometheus; make deps)" >&2; exit 1; }
promtool check rules "$here/fan-alerts.yml"
(cd "$here" && promtool test rules fan-alerts.test.yml fan-alerts-weekly.test.yml)
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$here/grafana-fan.json"
missing=0
for m in $(grep -ohE '\bfan_[a-z_]+' "$here/fan-alerts.yml" "$here/grafana-fan.json" | sed -E 's/_(bucket|count|sum)$//' | sort -u); do
	if ! grep -rqF --include='*.go' --exclude='*_test.go' "\"$m\"" "$top/services" "$top/pkg"; then
		echo "check.sh: $m is queried but no Go code registers it" >&2
		missing=1
	fi
done
((missing == 0))
echo "prometheus: rules checked and tested, dashboard valid, every queried metric exists"
