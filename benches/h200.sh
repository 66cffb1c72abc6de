#!/usr/bin/env bash
# On the lent H200 (benches/README.md says how), after .gpu/install.sh: installs the carried
# project wheel, restores the JIT caches carried in .gpu/cache, then runs the named steps
# (NAME=COMMAND) with a time limit each. A step over its limit gets SIGABRT, so Python's
# faulthandler prints every thread's stack into its log. Logs go under $OUT; each log's tail is
# printed last. SAVE_CACHE=1 tars the JIT caches to $OUT/jit.tgz.
set -u
source .gpu/env.sh
caches=(tmp/flashinfer-ws "${HOME#/}/.triton/cache" "${HOME#/}/.cache/rose")
if [ ! -e /tmp/.caches-restored ]; then
  for t in .gpu/cache/*.tgz; do [ -e "$t" ] && tar xzf "$t" -C /; done
  touch /tmp/.caches-restored
fi
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/ivy dist/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/ivy:$PYTHONPATH PATH=/tmp/ivy/bin:$PATH PYTHONWARNINGS=ignore PYTHONFAULTHANDLER=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
summary=()
for step in "$@"; do
  name=${step%%=*}; cmd=${step#*=}; limit=${LIMIT:-400}
  start=$(date +%s)
  timeout -s ABRT -k 15 "$limit" bash -c "$cmd" > "$OUT/$name.log" 2>&1; rc=$?
  summary+=("$name rc=$rc $(( $(date +%s) - start ))s")
  echo "${summary[-1]}" >> "$OUT/summary.txt"
done
if [ -n "${SAVE_CACHE:-}" ]; then
  present=(); for c in "${caches[@]}"; do [ -e "/$c" ] && present+=("$c"); done
  tar czf "$OUT/jit.tgz" -C / "${present[@]}"
fi
for step in "$@"; do name=${step%%=*}; echo "=== $name"; tr '\r' '\n' < "$OUT/$name.log" | grep -v "Writing model\|Loading weights" | tail -n "${TAIL:-25}"; done
printf '%s\n' "${summary[@]}"
