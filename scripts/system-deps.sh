#!/usr/bin/env bash
# Debian packages the test suite drives for real: Chromium (the dashboard test) and Prometheus
# (promtool and a server evaluating the Grafana panels), Redis (limits shared by replicas).
# Installed only when missing. Extra packages a benchmark needs are named as arguments
# (`system-deps.sh nginx`: the overhead benchmark's side-by-side reference), so `make test`
# does not install them.
set -euo pipefail
need=()
for extra in "$@"; do
    command -v "$extra" >/dev/null 2>&1 || need+=("$extra")
done
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: please install: ${need[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
