#!/usr/bin/env bash
# Build llama-cpp-python once as a portable wheel and print its path (make setup installs it).
#
# llama.cpp's default build (GGML_NATIVE=ON) targets the instruction set of the machine that
# compiles it: built on an AVX-512 CPU it dies with SIGILL on players' CPUs without AVX-512,
# and greedy text follows the kernels of the build machine. This build is llama.cpp's own
# answer, as in its release builds: no -march=native, the ggml backends as loadable modules,
# and one CPU backend per microarchitecture (x64, sse42, sandybridge, haswell, skylakex,
# icelake, alderlake, zen4, ...); bridge/engines/llama/_cpu.py loads them and llama.cpp picks
# the best one the CPU runs.
#
# pip's wheel cache ignores CMAKE_ARGS, so the wheel is kept in a folder of its own whose name
# carries the version and the flags: a change to either builds anew, anything else reuses it.
# The first build takes ~8 minutes on 2 cores; it prints a line every 10% of the compile.
set -euo pipefail
version="${LLAMA_CPP_VERSION:?}"
flags="${LLAMA_CMAKE_ARGS:?}"
python="${PYTHON:-python3}"
cache="${OAM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oam-bridge/wheels}"
key=$(printf '%s\n%s\n%s\n' "$version" "$flags" "$("$python" -c 'import sys; print(sys.implementation.cache_tag)')" | sha256sum | cut -c1-12)
dir="$cache/llama-cpp-python-$version-$key"
wheel=$(ls "$dir"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then
  echo "$wheel"
  exit 0
fi
mkdir -p "$dir"
log="$dir/build.log"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "setup: compiling llama.cpp $version (llama-cpp-python): once, ~8 minutes on 2 cores"
  echo "setup:   flags $flags"
  echo "setup:   log $log"
} >&2
start=$(date +%s)
if ! CMAKE_ARGS="$flags" "$python" -m pip wheel -v --no-deps --no-cache-dir --no-binary llama-cpp-python \
    -w "$tmp" "llama-cpp-python==$version" 2>&1 | tee "$log" |
    awk '{ if (match($0, /^ *\[ *[0-9]+\/[0-9]+\]/)) { split(substr($0, RSTART, RLENGTH), a, /[][\/ ]+/);
           p = int(a[2] * 10 / a[3]) * 10; if (p > last) { last = p; printf "setup:   llama.cpp compile %d%%\n", p > "/dev/stderr";
           fflush("/dev/stderr") } } }'; then
  echo "setup: the llama.cpp build failed; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
built=$(ls "$tmp"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$built" ]; then
  echo "setup: the llama.cpp build made no wheel; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
mv "$built" "$dir/"
echo "setup: llama.cpp built in $(( $(date +%s) - start )) s" >&2
ls "$dir"/llama_cpp_python-*.whl | head -n 1
