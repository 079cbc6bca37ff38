#!/usr/bin/env bash
# Regenerate the example profile reports in reports/ from the bundled model `stdlib-moe`
# (about a minute on 2 CPU cores). Run from anywhere: bash reports/regenerate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
run="$(mktemp -d)/stdlib-moe"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
moetune profile --model stdlib-moe --ep-size 4 --ranks-per-node 2 --what-if --capacity-factor 1.25 --out "$run"
moetune report "$run" --format md --out reports/stdlib-moe-profile.md
moetune report "$run" --format html --out reports/stdlib-moe-profile.html
cp "$run/summary.json" reports/stdlib-moe-profile.summary.json
echo "reports/stdlib-moe-profile.{md,html} regenerated from $run"
