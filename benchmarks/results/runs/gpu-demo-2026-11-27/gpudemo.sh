# SmolLM2 on the GPU machine: weights converted once (timed apart), then `python -m workbench demo` timed
set -u
cat /tmp/wb/gguf.part.aa .devcarry/b/gguf.part.ab > /tmp/wb/SmolLM2-135M-Instruct.Q4_1.gguf
pip install -q --no-deps --target /tmp/wb/py /tmp/wb/gguf-0.19.0-py3-none-any.whl 2>/dev/null
export PYTHONPATH=/tmp/wb/py WORKBENCH_SMOLLM2_GGUF=/tmp/wb/SmolLM2-135M-Instruct.Q4_1.gguf WORKBENCH_DATA_DIR=/tmp/wb/data WORKBENCH_CACHE=/tmp/wb/cache
G="$(nvidia-smi --query-gpu=name --format=csv,noheader)"
STAMP='import sys,time
t=time.time()
for l in sys.stdin: print(f"{time.time()-t:6.1f} s | {l}", end="", flush=True)'
python -c "import time;t=time.time()
from workbench.models.smollm2 import smollm2_folder; smollm2_folder(); print(f'weights converted once in {time.time()-t:.1f} s')" > /tmp/conv.txt 2>&1
echo "# $G, $(date -u +%F); $(tail -1 /tmp/conv.txt); then python -m workbench demo --out /tmp/gdemo --quiet, each line stamped with the seconds since it started" > $OUT/gpu-demo.txt
PYTHONUNBUFFERED=1 /usr/bin/time -v python -m workbench demo --out /tmp/gdemo --quiet 2> $OUT/time-v.txt | python -c "$STAMP" | tee -a $OUT/gpu-demo.txt | tail -3
for m in mezo zo-offload speed/mezo speed/zo-offload; do cp /tmp/gdemo/$m/run.json $OUT/$(echo $m | tr / -).run.json; done
grep -E "Elapsed|Maximum resident" $OUT/time-v.txt
