#!/usr/bin/env bash
# Prints a greeting for its first argument.
set -euo pipefail
echo "Hello, ${1:?name required}!"
