#!/usr/bin/env bash
# Build llama.cpp (the peer a CPU user would pick instead of our engine) from the source that
# PyPI's llama-cpp-python sdist vendors, for `python -m engine bench peers`. Optional; never run in CI.
#
#   scripts/build_llama_cpp.sh [PREFIX]        (default /work/peers/llama.cpp; -j from $JOBS, 2)
#
# Idempotent: each stage (download, extract, configure, build) is skipped when its output exists.
# Layout under PREFIX: src/ (the sdist), tree -> the vendored llama.cpp source (it holds
# convert_hf_to_gguf.py and gguf-py), build/bin/ (llama-bench, llama-batched-bench, llama-server,
# llama-cli, llama-perplexity and the shared libraries; llama-cpp-python can use them via
# LLAMA_CPP_LIB_PATH). llama-perplexity's --kl-divergence is how engine/bench/int8_quality.py measures Q8_0.
#
# AMX is switched off: -march=native sees AMX on these VMs, and the VM traps the instructions, so a
# default build dies with SIGILL on any q8_0 model.
set -euo pipefail

PREFIX="${1:-/work/peers/llama.cpp}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"
TARGETS=(llama-bench llama-server llama-batched-bench llama-cli llama-perplexity)
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

mkdir -p "$PREFIX/src"
PREFIX="$(cd "$PREFIX" && pwd)"

sdist="$(ls "$PREFIX"/src/llama_cpp_python-*.tar.gz 2>/dev/null | head -n 1 || true)"
if [ -z "$sdist" ]; then
    echo "downloading the llama-cpp-python sdist into $PREFIX/src"
    "$PYTHON" -m pip download --no-deps --no-binary :all: llama-cpp-python -d "$PREFIX/src"
    sdist="$(ls "$PREFIX"/src/llama_cpp_python-*.tar.gz | head -n 1)"
fi

srcdir="${sdist%.tar.gz}"
if [ ! -f "$srcdir/vendor/llama.cpp/CMakeLists.txt" ]; then
    echo "extracting $sdist"
    tar -xzf "$sdist" -C "$PREFIX/src"
fi
# The vendored tree is a git submodule of the sdist's own .git. cmake makes that submodule's index
# a configure dependency, and its own git calls refresh the index: ninja then re-runs cmake for
# ever ("build.ninja still dirty"). Unhooked, the tree builds as plain source.
rm -f "$srcdir/vendor/llama.cpp/.git"
ln -sfn "$srcdir/vendor/llama.cpp" "$PREFIX/tree"

if [ -f "$PREFIX/build/CMakeCache.txt" ] && grep -q "modules/vendor/llama.cpp/index" "$PREFIX/build/build.ninja" 2>/dev/null; then
    rm -rf "$PREFIX/build"  # configured while the tree was still a submodule (see above)
fi
if [ ! -f "$PREFIX/build/CMakeCache.txt" ]; then
    cmake -S "$PREFIX/tree" -B "$PREFIX/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX"
fi

missing=()
for t in "${TARGETS[@]}"; do
    [ -x "$PREFIX/build/bin/$t" ] || missing+=("$t")
done
if [ "${#missing[@]}" -gt 0 ]; then
    cmake --build "$PREFIX/build" -j "$JOBS" --target "${missing[@]}"
fi
echo "llama.cpp ready: $PREFIX/build/bin ($(cd "$PREFIX/build/bin" && ls "${TARGETS[@]}" | tr '\n' ' '))"
