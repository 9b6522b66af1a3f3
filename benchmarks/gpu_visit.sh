#!/usr/bin/env bash
# One GPU visit: the GPU measurements the open issues still owe, in one command of at most
# ~9 minutes (BUDGET seconds, 540 by default) on a fresh one-GPU machine with 16 CPU cores
# (an H100 or H200), most important first, each part under its own `timeout`. Every table goes
# to $OUT (one file per part, 7 files: the machine returns at most 8), and a summary is printed.
#
#   part           issue  what                                                 expected (cap)
#   setup          -      unpack the staged wheels, pip install --target        ~30 s  (120 s)
#                         (no index); the C++ cores build in the background
#   a_offpolicy    49     benchmarks/offpolicy_gpu.py --tasks Humanoid-gmi-v0   ~200 s (260 s)
#                         --algo td3 --num-envs 4096 --ppo-seconds 60
#                         --cap-seconds 120: TD3's time to PPO's return at 60 s
#                         (the issue's mark is 300 s: too long for one visit);
#                         both runs include torch.compile's cold start
#   b_runs         50     benchmarks/runs.py --task Ant-gmi-v0 --num-envs 1024   ~150 s (220 s)
#                         --seeds 8 --device cuda --repeats 1: 8 seeds as GMIs
#                         vs one after another, after a 1-seed, 1-iteration run
#                         of each side (torch.compile's cache warm for both);
#                         runs.py has no per-GMI budget flag: the budgets-vs-
#                         none comparison is not measured
#   c_bound        52     benchmarks/gpu_sim.py --parts bound, Ant, Humanoid,    ~80 s  (150 s)
#                         ShadowHand at 8,192 worlds: the pool vs mujoco_warp's
#                         step alone on the same model and data
#   c_env          52     benchmarks/env_throughput.py --tasks Hopper-v5 Ant-v5  what is left
#                         Pong-v5 --threads 16 8 4 2 --seconds 1 --repeats 3      (all of it:
#                         (the 16-thread table first; EnvPool's column is n/a     ~6 min)
#                         unless envpool is installed there)
#
# Kernel compilation: Warp compiles each task's MuJoCo Warp kernels on first use (cold on a
# fresh machine: about 1-3 minutes a task on the GPU), once per machine (Warp's kernel cache,
# shared by processes). Part a compiles Humanoid's while it builds its pool, outside its timed
# training loop; at the start, background processes compile Ant's (for b) and ShadowHand's
# (for c) and build the C++ cores (for c_env), each waited for before the part that needs it,
# so no timed window includes a compile. torch.compile's cache is cold too (part a).
#
# Modes (run from anywhere; the repository is this script's parent folder):
#   bash benchmarks/gpu_visit.sh --stage    HERE, before the visit: packs what the device lacks
#       (the wheels in $WHEELS, default .whl/, for its Python 3.12; gymnasium-robotics' hand
#       assets only; ale-py's headers from $ALE_INCLUDE, default build/ale-py-0.12.1-include)
#       into .gpuvisit/1 .. .gpuvisit/N, each under 56 MiB (a call carries at most 64 MiB),
#       and prints the device calls to make.
#   bash benchmarks/gpu_visit.sh --receive  ON THE DEVICE, once per staged folder but the last
#       (carry [".gpuvisit/K"]): keeps its part in $HOLD (/tmp/gmi-visit) for the next call.
#       The machine goes back after 30 s idle: make these calls and the visit back to back.
#   bash benchmarks/gpu_visit.sh            ON THE DEVICE, the visit (carry the last folder):
#       joins the parts, installs, runs the parts above.
#   bash benchmarks/gpu_visit.sh --dry-run  anywhere: every part at tiny sizes on the CPU
#       (Warp's CPU device), the staged wheels checked against Python 3.12 by `pip --dry-run`.
#
# Environment: PY (the Python to run; default python3: on the device machine that is the one
# with a CUDA torch. The project's .venv cannot travel: its Python is 3.11 where the device's is
# 3.12, and its torch is CPU-only), OUT (where the tables go; default runs/gpu-visit[-dry]),
# BUDGET (seconds for all parts), HOLD, WHEELS, ALE_INCLUDE.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
MODE=visit
case "${1:-}" in
  --stage) MODE=stage ;;
  --receive) MODE=receive ;;
  --dry-run) MODE=dry ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_visit.sh [--stage | --receive | --dry-run]" >&2; exit 2 ;;
esac
PY=${PY:-python3}
HOLD=${HOLD:-/tmp/gmi-visit}
STAGE=$REPO/.gpuvisit
WHEELS=${WHEELS:-$REPO/.whl}
ALE_INCLUDE=${ALE_INCLUDE:-$REPO/build/ale-py-0.12.1-include}
CHUNK_MIB=56
# the wheels the device's image lacks (KINDS.md's package list), as staged
NEEDED="warp_lang mujoco_warp mujoco mujoco_core gymnasium farama_notifications tyro
docstring_parser shtab typeguard annotated_types nvtx ale_py glfw pyopengl etils cloudpickle"

need_wheel() {  # the wheel file of distribution $1 in $WHEELS (exactly one), or fail
  local found=("$WHEELS"/"$1"-[0-9]*.whl)
  if [ ! -e "${found[0]}" ] || [ "${#found[@]}" -ne 1 ]; then
    echo "stage: need exactly one $1 wheel in $WHEELS (found ${#found[@]}); fetch it with pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d $WHEELS NAME==VERSION" >&2
    return 1
  fi
  echo "${found[0]}"
}

stage() {
  local tmp files=() name w
  tmp=$(mktemp -d)
  mkdir -p "$tmp/pack/wheels" "$tmp/pack/site"
  for name in $NEEDED; do
    w=$(need_wheel "$name") || { rm -rf "$tmp"; return 1; }
    cp "$w" "$tmp/pack/wheels/"
  done
  # gymnasium-robotics: the Shadow hand's MJCF, meshes and textures only (the wheel is 26 MB;
  # gmi_drl.envs.warp.assets finds the package without importing it)
  w=$(need_wheel gymnasium_robotics) || { rm -rf "$tmp"; return 1; }
  "$PY" - "$w" "$tmp/pack/site" <<'EOF' || { rm -rf "$tmp"; return 1; }
import sys, zipfile
keep = ("gymnasium_robotics/__init__.py", "gymnasium_robotics/envs/assets/hand/",
        "gymnasium_robotics/envs/assets/stls/hand/", "gymnasium_robotics/envs/assets/textures/")
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep)])
EOF
  if [ -e "$ALE_INCLUDE/.complete" ]; then
    mkdir -p "$tmp/pack/build" && cp -r "$ALE_INCLUDE" "$tmp/pack/build/"
  else
    echo "stage: no ale-py headers at $ALE_INCLUDE (run make here first): Pong-v5 will run on ale-py's vector env, not the C++ core" >&2
  fi
  rm -rf "$STAGE" && mkdir -p "$tmp/parts"
  tar -cf - -C "$tmp/pack" . | split -b "${CHUNK_MIB}m" -d -a 1 - "$tmp/parts/p"
  files=("$tmp"/parts/p*)
  local n=${#files[@]} k=0
  for f in "${files[@]}"; do
    k=$((k + 1))
    mkdir -p "$STAGE/$k" && mv "$f" "$STAGE/$k/part-$k-of-$n"
  done
  rm -rf "$tmp"
  du -sh "$STAGE"/* | sed 's/^/stage: /'
  echo "stage: $n parts. Device calls, back to back (the machine goes back after 30 s idle):"
  for k in $(seq 1 $((n - 1))); do
    echo "  run(command='bash benchmarks/gpu_visit.sh --receive', carry=['.gpuvisit/$k'], timeout_s=120)"
  done
  echo "  run(command='PYTHONUNBUFFERED=1 bash benchmarks/gpu_visit.sh', carry=['.gpuvisit/$n'], timeout_s=600)"
}

receive() {  # keep the staged parts carried by this call in $HOLD/parts
  mkdir -p "$HOLD/parts"
  local got=0 f
  for f in "$STAGE"/*/part-*; do
    [ -e "$f" ] || continue
    cp "$f" "$HOLD/parts/" && got=$((got + 1))
  done
  echo "receive: kept $got part(s); $HOLD/parts holds: $(ls "$HOLD/parts" | tr '\n' ' ')"
}

joined_parts() {  # the staged parts in order, once all are here; else a message and failure
  local first n k
  first=$(ls "$HOLD/parts" 2>/dev/null | head -1)
  [ -n "$first" ] || { echo "no staged parts in $HOLD/parts (run --stage here, then the --receive calls)"; return 1; }
  n=${first##*-of-}
  for k in $(seq 1 "$n"); do
    [ -e "$HOLD/parts/part-$k-of-$n" ] || { echo "staged part $k of $n is missing (the machine went back between calls? start again with the first --receive call)"; return 1; }
  done
  for k in $(seq 1 "$n"); do echo "$HOLD/parts/part-$k-of-$n"; done
}

setup() {  # the device's Python env: install the staged wheels unless everything imports
  if "$PY" -c "import warp, mujoco_warp, gymnasium, tyro, mujoco, nvtx" 2>/dev/null; then
    echo "setup: $PY already imports warp, mujoco_warp, gymnasium, tyro, mujoco: nothing to install"
  else
    receive
    local parts
    parts=$(joined_parts) || { echo "setup: $parts"; return 1; }
    rm -rf "$HOLD/pack" && mkdir -p "$HOLD/pack" "$HOLD/site"
    # shellcheck disable=SC2086
    cat $parts | tar -xf - -C "$HOLD/pack" || { echo "setup: the parts do not unpack"; return 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$HOLD/site" "$HOLD"/pack/wheels/*.whl || { echo "setup: pip install failed"; return 1; }
    cp -r "$HOLD"/pack/site/. "$HOLD/site/"
    if [ -d "$HOLD/pack/build" ]; then mkdir -p "$REPO/build" && cp -r "$HOLD"/pack/build/. "$REPO/build/"; fi
  fi
  export PYTHONPATH="$REPO:$HOLD/site${PYTHONPATH:+:$PYTHONPATH}"
  "$PY" -c "
import torch, warp, mujoco_warp
print('setup: python', __import__('sys').version.split()[0], '| torch', torch.__version__, 'cuda',
      torch.version.cuda, 'available', torch.cuda.is_available(), '| warp', warp.__version__,
      '| mujoco_warp from', mujoco_warp.__file__)
assert torch.cuda.is_available(), 'this torch sees no CUDA device: set PY to a CUDA torch'
"
}

warm() {  # compile task $1's warp kernels (Warp's cache): a pool of 256 worlds, 3 steps
  "$PY" - "$1" "$DEVICE" <<'EOF'
import sys, time
import torch
from gmi_drl import envs
task, device = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
with envs.make(task, 256, seed=0, autoreset="same_step", device=device, tensors=True) as pool:
    pool.reset()
    for _ in range(3):  # kernel loading, graph capture, a replay
        pool.step(torch.zeros(256, pool.model.nu, device=pool.device))
    pool.check_limits()
print(f"warm: {task} compiled and stepped in {time.perf_counter() - t0:.0f} s")
EOF
}

SUMMARY=""
note() { echo "$*"; SUMMARY+="$*"$'\n'; }

part() {  # part NAME CAP_S MIN_S COMMAND...: under timeout, within the visit's budget
  local name=$1 cap=$2 min=$3 left t0 rc limit
  shift 3
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt "$min" ]; then
    note "$name: SKIPPED ($left s of the budget left, it needs $min s)"
    return
  fi
  limit=$((cap < left ? cap : left))
  echo "== $name (timeout $limit s): $*"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  tail -n 25 "$OUT/$name.txt"
  case $rc in
    0) note "$name: done in $(( $(date +%s) - t0 )) s" ;;
    124|137) note "$name: CUT at its $limit s timeout (what it printed is in $name.txt)" ;;
    *) note "$name: FAILED (exit $rc after $(( $(date +%s) - t0 )) s; see $name.txt)" ;;
  esac
}

wait_for() {  # wait_for PID WHAT: a background job, its log appended to setup.txt
  wait "$1" 2>/dev/null
  echo "-- $2 (exit $?):" >> "$OUT/setup.txt"
  cat "$HOLD/$2.log" >> "$OUT/setup.txt" 2>/dev/null
}

case $MODE in
  stage) stage; exit $? ;;
  receive) receive; exit 0 ;;
esac

START=$(date +%s)
mkdir -p "$HOLD"
if [ "$MODE" = dry ]; then
  DEVICE=cpu OUT=${OUT:-$REPO/runs/gpu-visit-dry} BUDGET=${BUDGET:-1200} GPU=""
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  mkdir -p "$OUT"
  {
    echo "dry run: $PY on the CPU; the staged parts checked, not installed"
    receive
    if parts=$(joined_parts); then
      # shellcheck disable=SC2086
      cat $parts | tar -tf - > "$HOLD/listing" && echo "the $(echo "$parts" | wc -l) parts join into one tar of $(grep -c '\.whl$' "$HOLD/listing") wheels, $(grep -c 'hand/.*\.xml$' "$HOLD/listing") hand MJCF files, ale headers: $(grep -c 'ale-py.*\.hpp$' "$HOLD/listing")"
      rm -rf "$HOLD/check" && mkdir -p "$HOLD/check"
      # shellcheck disable=SC2086
      cat $parts | tar -xf - -C "$HOLD/check" --wildcards './wheels/*'
      "$PY" -m pip install --dry-run -q --no-index --no-deps --target "$HOLD/check/site" \
        --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
        --only-binary=:all: "$HOLD"/check/wheels/*.whl && echo "pip --dry-run: the wheels install on CPython 3.12"
      rm -rf "$HOLD/check"
    else
      echo "(no staged parts: $parts)"
    fi
  } > "$OUT/setup.txt" 2>&1
  cat "$OUT/setup.txt"
  A_ARGS=(--device cpu --num-envs 16 --ppo-seconds 10 --cap-seconds 15)
  B_SEEDS_ITERS=(2 1) B_ARGS=(--num-envs 8 --device cpu)
  C_ARGS=(--device cpu --num-envs 8 --seconds 0.2 --repeats 1)
  E_ARGS=(--threads 2 --seconds 0.2 --repeats 1)
else
  DEVICE=cuda:0 OUT=${OUT:-$REPO/runs/gpu-visit} BUDGET=${BUDGET:-540}
  mkdir -p "$OUT"
  setup > "$OUT/setup.txt" 2>&1
  rc=$?
  cat "$OUT/setup.txt"
  [ $rc -eq 0 ] || { echo "setup failed: nothing measured"; exit 1; }
  export PYTHONPATH="$REPO:$HOLD/site${PYTHONPATH:+:$PYTHONPATH}"
  GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
  echo "gpu: $GPU" >> "$OUT/setup.txt"
  A_ARGS=(--device cuda --num-envs 4096 --ppo-seconds 60 --cap-seconds 120)
  B_SEEDS_ITERS=(8 3) B_ARGS=(--num-envs 1024 --device cuda)
  C_ARGS=(--device cuda:0 --num-envs 8192 --seconds 1 --repeats 3)
  E_ARGS=(--threads 16 8 4 2 --seconds 1 --repeats 3)
fi
DEADLINE=$((START + BUDGET))
note "visit on $DEVICE (${GPU:-no GPU}, $(nproc) CPU cores), budget $BUDGET s, tables in $OUT"

# background: the kernels parts b and c need, and the C++ cores of c_env (niced: part a runs)
warm Ant-gmi-v0 > "$HOLD/warm-ant.log" 2>&1 & WARM_ANT=$!
warm ShadowHand-gmi-v0 > "$HOLD/warm-hand.log" 2>&1 & WARM_HAND=$!
if [ "$MODE" = dry ]; then BUILD=""; else
  (cd "$REPO" && nice -n 10 "$PY" setup.py -q build_ext --inplace -j 8) > "$HOLD/build.log" 2>&1 & BUILD=$!
fi

part a_offpolicy 260 120 "$PY" "$REPO/benchmarks/offpolicy_gpu.py" --tasks Humanoid-gmi-v0 \
  --algo td3 --out "$HOLD/offpolicy" "${A_ARGS[@]}"
wait_for $WARM_ANT warm-ant
# b's first side would pay torch.compile's cold start for Ant's shapes (the other side then
# finds the cache warm): one run of each side with one seed and one iteration first
part b_runs 220 100 bash -c '"$0" "$1" --task Ant-gmi-v0 --seeds 1 --iterations 1 --repeats 1 \
  "${@:4}" > /dev/null && echo "(torch.compile warmed by one run of each side, 1 seed)" &&
  "$0" "$1" --task Ant-gmi-v0 --seeds "$2" --iterations "$3" --repeats 1 "${@:4}"' \
  "$PY" "$REPO/benchmarks/runs.py" "${B_SEEDS_ITERS[@]}" "${B_ARGS[@]}"
wait_for $WARM_HAND warm-hand
part c_bound 150 45 "$PY" "$REPO/benchmarks/gpu_sim.py" --parts bound \
  --tasks Ant-gmi-v0 Humanoid-gmi-v0 ShadowHand-gmi-v0 "${C_ARGS[@]}"
if [ -n "$BUILD" ]; then
  wait_for "$BUILD" build
  if "$PY" -c "import gmi_drl.envs._mujoco_core, gmi_drl.envs._atari_core" 2>/dev/null; then
    note "C++ cores built: c_env's gmi-drl column is the C++ engine"
  else
    note "C++ cores NOT built (setup.txt has the log): c_env's gmi-drl column is the NumPy / ale-py fallback"
  fi
fi
part c_env 600 45 "$PY" "$REPO/benchmarks/env_throughput.py" --tasks Hopper-v5 Ant-v5 Pong-v5 \
  "${E_ARGS[@]}"

note "visit: $(( $(date +%s) - START )) s in all"
echo
echo "================ summary ================"
printf '%s' "$SUMMARY" | tee "$OUT/summary.txt"
