#!/usr/bin/env bash
# scripts/cuda_check.sh: the CUDA backend's checks on a machine with an NVIDIA GPU (CI has none):
# build with CUDA for this GPU, run tests/cuda, then decode speed against llama.cpp built with
# -DGGML_CUDA=ON, on the same random 8-layer llama (2048 wide, q4_0 and q8_0) made there.
#
#   bash scripts/cuda_check.sh prepare      # here, with network: fills .gpu-carry/ (ignored by git)
#   bash scripts/cuda_check.sh [test|bench|all]   # there (default all); results in $OUT or build/cuda-check
#
# `prepare` puts into .gpu-carry/: wheels (Python 3.12, manylinux x86-64) of the ember dependencies
# a CUDA image with PyTorch lacks, and a copy of the llama.cpp source (from $EMBER_PEER_DIR or
# ~/.cache/ember-peer, as ../shared/bench/build_llamacpp.sh fetched it) trimmed to what
# llama-bench needs — together under ~40 MiB, so that the tree fits a 64 MiB transfer. The GPU
# side needs nvcc, cmake, ninja and python3 with numpy, torch, transformers (as such images have);
# nothing is fetched there. PEER_CMAKE_ARGS adds options to llama.cpp's configure, as in
# build_llamacpp.sh. On 16 cores: ember's build ~2 min, tests/cuda ~3 min, llama.cpp's CUDA build
# of llama-bench for one architecture ~4 min, the model and both benchmarks ~2 min.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu-carry
mode=${1:-all}

if [[ $mode == prepare ]]; then
  grep -qx "/$CARRY/" "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null ||
    echo "/$CARRY/" >>"$(git rev-parse --git-common-dir)/info/exclude"
  rm -rf "$CARRY" && mkdir -p "$CARRY/whl"
  # ember's runtime and test dependencies that the image lacks, each without its dependencies
  # (those the image has are left out, so one version of each is installed), at the versions
  # installed here, where the tests pass.
  names="gguf starlette uvicorn llguidance openai anthropic distro jiter pydantic pydantic-core
    annotated-types typing-inspection typing-extensions sniffio anyio docstring-parser jsonschema
    jsonschema-specifications referencing rpds-py websockets httpx2 httpcore2 truststore opentelemetry-api"
  pinned=$(python3 -c "
import importlib.metadata as m, sys
for n in sys.argv[1:]:
    try: print(f'{n}=={m.version(n)}')
    except m.PackageNotFoundError: print(n)" $names)
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$CARRY/whl" $pinned
  peer=${EMBER_PEER_DIR:-$HOME/.cache/ember-peer}/llama.cpp
  [[ -f $peer/CMakeLists.txt ]] || { echo "no llama.cpp source at $peer (run ../shared/bench/build_llamacpp.sh)"; exit 1; }
  dst=$CARRY/llama.cpp
  mkdir -p "$dst/ggml/src" "$dst/tools"
  cp -r "$peer"/{CMakeLists.txt,cmake,include,src,common,vendor,licenses} "$dst/"
  cp -r "$peer"/ggml/{CMakeLists.txt,cmake,include} "$dst/ggml/"
  find "$peer/ggml/src" -maxdepth 1 -type f -exec cp {} "$dst/ggml/src/" \;
  cp -r "$peer"/ggml/src/{ggml-cpu,ggml-cuda} "$dst/ggml/src/"
  cp -r "$peer"/tools/llama-bench "$dst/tools/"
  echo 'add_subdirectory(llama-bench)' >"$dst/tools/CMakeLists.txt"
  du -sh "$CARRY" "$CARRY"/*
  echo "now run on the GPU machine, carrying $CARRY: bash scripts/cuda_check.sh"
  exit 0
fi

RESULTS=${OUT:-build/cuda-check}
mkdir -p "$RESULTS"
log() { echo "[$(date -u +%H:%M:%S) +$SECONDS s] $*" | tee -a "$RESULTS/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$RESULTS/summary.txt"

if [[ -d $CARRY/whl ]] && ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$CARRY"/whl/*.whl
  export PYTHONPATH=/tmp/site
fi
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export CUDACXX=$NVCC CUDAARCHS=${CUDAARCHS:-native}  # this GPU only: the build is 4x shorter
JOBS=$(nproc)
export EMBER_BUILD_JOBS=$JOBS

BUILD=build/cuda-check
if [[ $mode == all || $mode == test || $mode == bench ]]; then
  log "building ember with CUDA ($NVCC, architectures $CUDAARCHS)"
  cmake -S . -B $BUILD -G Ninja -DEMBER_CUDA=ON -DPython_EXECUTABLE="$(command -v python3)" \
    >"$RESULTS/ember-configure.log" 2>&1 || { tail -30 "$RESULTS/ember-configure.log"; exit 1; }
  cmake --build $BUILD -j"$JOBS" --target _core >"$RESULTS/ember-build.log" 2>&1 ||
    { grep -m10 -A8 error "$RESULTS/ember-build.log"; exit 1; }
  export PYTHONPATH=$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "from ember import _core; print(_core.devices())" | tee -a "$RESULTS/summary.txt"
fi

if [[ $mode == all || $mode == test ]]; then
  # The SmolLM2 test fetches its model from PyPI, which that machine cannot reach.
  log "tests/cuda"
  EMBER_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider tests/cuda \
    -k "not smollm2" --durations=8 2>&1 | tee "$RESULTS/tests.log" | tail -40 || true
  tail -1 "$RESULTS/tests.log" >>"$RESULTS/summary.txt"
fi

if [[ $mode == all || $mode == bench ]]; then
  peer=$CARRY/llama.cpp
  [[ -d $peer ]] || peer=${EMBER_PEER_DIR:-$HOME/.cache/ember-peer}/llama.cpp
  log "building llama.cpp's llama-bench with GGML_CUDA=ON ($peer)"
  # shellcheck disable=SC2086
  cmake -S "$peer" -B build/llama-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDAARCHS" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_SERVER=OFF ${PEER_CMAKE_ARGS:-} >"$RESULTS/llama-configure.log" 2>&1 ||
    { tail -30 "$RESULTS/llama-configure.log"; exit 1; }
  cmake --build build/llama-cuda -j"$JOBS" --target llama-bench >"$RESULTS/llama-build.log" 2>&1 ||
    { grep -m10 -A8 error "$RESULTS/llama-build.log"; exit 1; }
  log "a random 8-layer llama (2048 wide, ffn 5632, GQA 32/4; stories260K's tokenizer), q4_0 and q8_0"
  models=build/cuda-check-models
  mkdir -p $models
  python3 - "$models" <<'EOF'
import shutil, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
out = Path(sys.argv[1]) / "hf"
src = Path("tests/data/stories260K-hf")
cfg = LlamaConfig.from_pretrained(src)
cfg.update(dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=32,
                num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False))
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
for f in ("tokenizer.model", "tokenizer_config.json"):
    shutil.copy(src / f, out / f)
EOF
  for t in q4_0 q8_0; do
    python3 -m ember.cli convert $models/hf -o $models/llama-$t.gguf --type "$t" --force \
      >"$RESULTS/convert-$t.log" 2>&1 || { tail -20 "$RESULTS/convert-$t.log"; exit 1; }
    log "decode $t: ember --device cuda (pp512, tg128, 3 runs)"
    python3 -m ember.cli bench $models/llama-$t.gguf -p 512 -n 128 -r 3 --device cuda --json \
      | tee "$RESULTS/ember-$t.json" | tee -a "$RESULTS/summary.txt"
    log "decode $t: llama-bench -ngl 99 (pp512, tg128, 3 runs)"
    build/llama-cuda/bin/llama-bench -m $models/llama-$t.gguf -ngl 99 -p 512 -n 128 -r 3 -o json \
      | tee "$RESULTS/llama-$t.json" | python3 -c "
import json, sys
for r in json.load(sys.stdin):
    print(f\"llama.cpp {r['n_prompt']=} {r['n_gen']=}: {r['avg_ts']:.1f} t/s\")" | tee -a "$RESULTS/summary.txt"
  done
fi
log "done"
