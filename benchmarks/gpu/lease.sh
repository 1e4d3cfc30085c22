#!/usr/bin/env bash
# One device call of about 600 s (device tool: `run`, carry [".bundle"], timeout_s 600,
# command `bash benchmarks/gpu/lease.sh`; PART=curve (default), wide or pretrain, MIN=its
# minutes of pretraining, default 4; LOOP=0 leaves the loop profiles out; ARGS: more of the
# part's options, e.g. ARGS="--set pretrain.seed=2 --until adapt"): the loop profile alone,
# then PART with `check` beside it on its own cores, then the other loop variants while time
# is left.
# Everything comes back packed into $OUT (at most 8 files).
set -u
export PYTHONUNBUFFERED=1 W=.gpu-run
G="python3 -m benchmarks.gpu run"
END=${END:-588}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "from benchmarks.gpu.run import install; install()" || exit 1
echo "installed at ${SECONDS}s"
if [ "${LOOP:-1}" = 1 ]; then
  timeout 120 $G loop --variants 0 --out $W/o --work $W --pack $OUT
  echo "loop v0 done at ${SECONDS}s"
fi
# the part and `check` on cores of their own, split from those this machine grants (fixed
# lists assumed 16 cores numbered from 0); unpinned if that cannot be read
PART_CPUS=""; CHECK_CPUS=""; CHECK_THREADS=6
eval "$(python3 -m benchmarks.gpu.cores)"
A=""; B=""
if command -v taskset >/dev/null && [ -n "$CHECK_CPUS" ]; then
  A="taskset -c $PART_CPUS"; B="taskset -c $CHECK_CPUS"
fi
mkdir -p $W/oc
OMP_NUM_THREADS=$CHECK_THREADS timeout 330 $B $G check --out $W/oc --work $W/c --pack $OUT/check >$W/oc/check-stdout.log 2>&1 &
CK=$!
P=${PART:-curve}
timeout $((END - SECONDS - 12)) $A $G $P --minutes ${MIN:-4} --tokens 60e6 ${ARGS:-} --out $W/o --work $W --pack $OUT
echo "$P done at ${SECONDS}s rc $?"
if [ "$P" = curve ] && ! ls $OUT/curve.tar.part* >/dev/null 2>&1; then  # cut off: the models so far
  (cd $W/curve && tar cf - $(find . -name model.safetensors -printf '%h\n' | sort -u) 2>/dev/null) | split -b 15M - $OUT/curvex.tar.part
fi
if [ "$P" = wide ] && ! ls $OUT/wide-model.tar.part* >/dev/null 2>&1; then  # cut off: the log,
  R=$(cd $W/wide 2>/dev/null && find . -path '*tncc-title*' -name results.json)  # the results
  tar cf $OUT/wide-left.tar -C $W o/wide.log ${R:+-C "$PWD/$W/wide" $R}  # and the last model
  M=$(ls -dt $W/wide/adapt/out-*/model/model $W/wide/pretrain/out-*/model/model 2>/dev/null | head -1)
  [ -n "$M" ] && tar cf - -C "$M/.." model | split -b 15M - $OUT/widex.tar.part
fi
wait $CK; echo "check done at ${SECONDS}s"
left=$((END - SECONDS))
if [ "${LOOP:-1}" = 1 ] && [ $left -gt 45 ]; then timeout $left $G loop --variants 4,1,3,2 --out $W/o2 --work $W --pack $OUT/loop2; fi
echo "end at ${SECONDS}s"; ls -la $OUT $OUT/* 2>/dev/null | head -30
