#!/usr/bin/env bash
# Build llama-cpp-python[server] — the real OpenAI-compatible peer the HTTP engine's
# integration tests run on loopback — into its own venv (.venv-llamacpp), so the main venv
# stays lean. It builds from source (no CPU wheel is published): DESIGN.md's CMAKE_ARGS,
# because the native build crashes on this CPU. The built wheel is cached under
# ~/.cache/canaryd/wheels/<flags hash>/ so the next run reuses it; a fresh machine builds it.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${LLAMACPP_VENV:-.venv-llamacpp}"
VERSION="0.3.36"
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
FLAGS_HASH="$(printf '%s %s' "$VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-12)"
WHEELS="${CANARYD_WHEEL_CACHE:-$HOME/.cache/canaryd/wheels}/llama-cpp-python-$FLAGS_HASH"
STAMP="$VENV/.installed-$FLAGS_HASH"

if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import llama_cpp.server" >/dev/null 2>&1; then
    echo "llamacpp: $VENV ready (llama-cpp-python $VERSION)"
    exit 0
fi
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
    echo "llamacpp: building llama-cpp-python $VERSION from source (several minutes on 2 cores)"
    start=$(date +%s)
    CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$PYTHON" -m pip wheel --quiet --no-deps --no-binary llama-cpp-python \
        --wheel-dir "$WHEELS" "llama-cpp-python==$VERSION"
    echo "llamacpp: built in $(( $(date +%s) - start )) s -> $WHEELS"
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
# --only-binary keeps pip from rebuilding: the wheel must come from the cache above.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --find-links "$WHEELS" --only-binary llama-cpp-python "llama-cpp-python[server]==$VERSION"
"$VENV/bin/python" -c "import llama_cpp.server"
touch "$STAMP"
echo "llamacpp: $VENV ready (llama-cpp-python $VERSION)"
