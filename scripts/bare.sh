#!/usr/bin/env bash
# Runs a command with this checkout importable as the package `shadowsync` without installing it
# (a bare copy of the repository, as the lent GPU machine gets): a link named `shadowsync` to the
# repository, in a temporary folder put first on PYTHONPATH (typecheck.sh shows it to mypy the
# same way), so `python -m shadowsync.benchmarks.<name>` works whatever the folder is called.
#
#   scripts/bare.sh python3 -m shadowsync.benchmarks.gpu_check --device cpu
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
ln -s "$repo" "$tmp/shadowsync"
PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}" "$@"
