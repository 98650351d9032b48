#!/usr/bin/env bash
# README's test command: installs what the tests need (tests/setup.sh), then runs the whole
# suite. CI's .ci/run ends with this very script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
cargo test --workspace "$@"
