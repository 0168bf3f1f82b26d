#!/usr/bin/env bash
# mypy over the package (settings in pyproject.toml). The repository root is the package
# `shadowsync`, so mypy reads it under that name through a link in a temporary folder.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
ln -s "$repo" "$tmp/shadowsync"
cd "$tmp"
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" \
  --python-executable "$repo/.venv/bin/python" \
  -p shadowsync.sync -p shadowsync.pipelines -p shadowsync.models -p shadowsync.datasets \
  -p shadowsync.torchx_components -p shadowsync.benchmarks -m shadowsync.registry \
  -m shadowsync.sections \
  -m shadowsync.testing
