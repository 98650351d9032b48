#!/usr/bin/env bash
# README's test command: installs what the tests need (tests/setup.sh), then runs the whole
# suite. CI's .ci/run ends with this very script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
# Every `runway` process the tests start compiles the built-in plugins into its config dir's
# cache unless told otherwise; one cache for the whole run compiles each plugin once (a test
# that is about the cache names its own directory in its config).
export RUNWAY_PLUGIN_CACHE_DIR="${RUNWAY_PLUGIN_CACHE_DIR:-$PWD/target/test-plugin-cache}"
cargo test --workspace "$@"
