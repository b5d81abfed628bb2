#!/usr/bin/env bash
# The serving engines' own Python modules for the engine-plug-in tests (tests/cpu/test_engines.py), with no
# engine installed: vLLM's and SGLang's wheels (the versions in fused_ar/integrations/__init__.py,
# ENGINE_VERSIONS) and the small packages their distributed, plug-in and compilation modules need to import
# on a CPU machine, downloaded with `pip download --no-deps` and unpacked into .venv/engines/site.
# Nothing is installed into .venv. Re-running reuses what is there.
#
#   bash scripts/engines.sh       (scripts/test.sh runs it after scripts/setup.sh)
#
# Where the package registry cannot be reached, .venv/engines/unreachable records pip's last lines and the
# tests skip with that reason; any other failure fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
DIR=.venv/engines
mkdir -p "$DIR/wheels" "$DIR/site"
rm -f "$DIR/unreachable"

mapfile -t ENGINES < <("$PY" -c 'from fused_ar.integrations import ENGINE_VERSIONS as v
for name, version in v.items(): print(f"{name}=={version}")')
# Import-only dependencies of the modules the tests load (no tokenizer, grammar or server runs). Where the
# engines' pins differ the vLLM side is taken (tokenizers, xgrammar).
EXTRAS=(
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-types==0.8.0 anyio==4.16.0
  apache-tvm-ffi==0.1.11 attrs==26.1.0 cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1
  cloudpickle==3.1.3 frozenlist==1.8.0 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface-hub==2.4.0
  idna==3.20 ipython==9.18.1 llguidance==1.7.6 msgspec==0.23.0 multidict==7.2.1 orjson==3.13.0
  prometheus-client==0.26.0 propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1
  pydantic==2.14.4 pydantic-core==2.50.5 pyyaml==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2
  safetensors==0.8.0 starlette==1.10.0 tokenizers==0.23.3 traitlets==5.16.1 transformers==5.19.0
  truststore==0.10.5 typing-inspection==0.4.5 urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1
)
# SGLang imports triton at the top of its package: brought here unless .venv has one.
"$PY" -c 'import triton' 2>/dev/null || EXTRAS+=("triton>=3.9,<3.10")

want="${ENGINES[*]} ${EXTRAS[*]}"
if [ -e "$DIR/.complete" ] && [ "$(cat "$DIR/.complete")" = "$want" ]; then
  echo "engines: ${ENGINES[*]} unpacked in $DIR/site"
  exit 0
fi
echo "engines: pip download --no-deps ${ENGINES[*]} + ${#EXTRAS[@]} packages (vLLM's wheel is 239 MB)"
if ! "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DIR/wheels" "${ENGINES[@]}" "${EXTRAS[@]}" \
     > "$DIR/pip.log" 2>&1; then
  if grep -qiE "connection|resolve|network|timed out|unreachable|proxy|Max retries" "$DIR/pip.log"; then
    { echo "the package registry cannot be reached:"; tail -3 "$DIR/pip.log"; } > "$DIR/unreachable"
    echo "engines: $(head -1 "$DIR/unreachable") (the engine tests will skip)"
    exit 0
  fi
  tail -20 "$DIR/pip.log" >&2
  exit 1
fi
rm -rf "$DIR/site" && mkdir -p "$DIR/site"
for whl in "$DIR"/wheels/*.whl; do
  "$PY" -m zipfile -e "$whl" "$DIR/site"
done
echo "$want" > "$DIR/.complete"
echo "engines: ${ENGINES[*]} unpacked in $DIR/site"
