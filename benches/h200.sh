#!/usr/bin/env bash
# On the lent H200 (benches/README.md says how), after .gpu/install.sh: installs the carried
# project wheel, restores the JIT caches carried in .gpu/cache, then runs the named steps
# (NAME=COMMAND) with a time limit each. A step over its limit gets SIGABRT, so Python's
# faulthandler prints every thread's stack into its log. Logs go under $OUT; each log's tail is
# printed last. SAVE_CACHE=1 writes the caches to $OUT: FlashInfer's built modules as
# fi-aot.tgz, Triton's and FA4's as jit.tgz; keep them in .gpu/cache for the next machine.
#
# FlashInfer's JIT cache cannot travel as it is: ninja rebuilds whatever is older than the
# freshly installed headers. Its built modules are loaded without ninja from its AOT folder.
set -u
source .gpu/env.sh
# The carried wheels' folder: the first entry env.sh puts on PYTHONPATH. quack's compile-cache
# keyer treats only code under a "site-packages" path as installed; elsewhere it hashes the
# DSL's own globals, meets a ContextVar and refuses to compile. So the folder is reached
# through a link of that name.
site=${PYTHONPATH%%:*}
case $site in
  */site-packages) ;;
  *) mkdir -p /tmp/gpu && ln -sfn "$site" /tmp/gpu/site-packages
     PYTHONPATH=${PYTHONPATH//$site//tmp/gpu/site-packages}; site=/tmp/gpu/site-packages ;;
esac
aot=$site/flashinfer/data/aot
caches=("${HOME#/}/.triton/cache" "${HOME#/}/.cache/rose")
if [ ! -e /tmp/.caches-restored ]; then
  mkdir -p "$aot"
  [ -e .gpu/cache/fi-aot.tgz ] && tar xzf .gpu/cache/fi-aot.tgz -C "$aot"
  [ -e .gpu/cache/jit.tgz ] && tar xzf .gpu/cache/jit.tgz -C /
  touch /tmp/.caches-restored
fi
python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/ivy dist/*.whl 2>&1 | grep -v WARNING
# An earlier build carried in dist/before/ (for before/after in one start: peers.py --ivy-from).
for wheel in dist/before/*.whl; do
  [ -e "$wheel" ] && python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/ivy-before "$wheel" 2>&1 | grep -v WARNING
done
export PYTHONPATH=/tmp/ivy:$PYTHONPATH PATH=/tmp/ivy/bin:$PATH PYTHONWARNINGS=ignore PYTHONFAULTHANDLER=1
# The lent machine sets PYTHONDONTWRITEBYTECODE and its packages carry no bytecode, so every
# process would compile torch's and FlashInfer's Python again (+1.6 s to import torch alone). A
# pip-installed host keeps bytecode; so does this, in a cache under /tmp.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
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
  for built in "$FLASHINFER_WORKSPACE_BASE"/.cache/flashinfer/*/*/cached_ops/*/*.so; do
    [ -e "$built" ] && mkdir -p "$aot/$(basename "$(dirname "$built")")" && cp -n "$built" "$aot/$(basename "$(dirname "$built")")/"
  done
  (cd "$aot" && tar czf "$OUT/fi-aot.tgz" ./*/*.so)
  present=(); for c in "${caches[@]}"; do [ -e "/$c" ] && present+=("$c"); done
  tar czf "$OUT/jit.tgz" -C / "${present[@]}"
fi
for step in "$@"; do name=${step%%=*}; echo "=== $name"; tr '\r' '\n' < "$OUT/$name.log" | grep -v "Writing model\|Loading weights" | tail -n "${TAIL:-25}"; done
printf '%s\n' "${summary[@]}"
