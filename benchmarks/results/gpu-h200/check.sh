#!/bin/bash
# One device call: the GPU checks of this session (issue 30's start from partial models on CUDA, lia.py on an H200).
# Run from the repository root on the GPU machine; $OUT is the folder whose files come back. It expects two folders
# carried beside the checkout (the machine reaches no network): .whl/ with the wheels its Python lacks (pyzmq,
# aiomqtt, paho-mqtt, tomli-w, pytest-asyncio, for Python 3.12) and .gpu/ with Debian's dataset-fashion-mnist
# files (/usr/share/datasets/fashion-mnist/*.gz). Its output: call-1.log beside this file.
export PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { echo "== $* ($(date +%T))" | tee -a $L; }
step info
nvidia-smi -L 2>&1 | tee -a $L; nproc | tee -a $L
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>$L 2>&1 || exit 3
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /usr/share/datasets/fashion-mnist && cp .gpu/*.gz /usr/share/datasets/fashion-mnist/
python3 -c "import sys,torch,zmq;print(sys.version.split()[0],'torch',torch.__version__,'zmq',zmq.__version__,torch.cuda.get_device_name(0))" 2>&1 | tee -a $L
P="python3 -m p2pfed"
step quickstart pfedlia-p2p and oracle-p2p, device auto, seeds 0-2
timeout 200 $P run scenarios/quickstart.toml --methods pfedlia-p2p,oracle-p2p --seeds 0-2 --set "train.device='auto'" --out /tmp/qa -q 2>&1 | tail -25 | tee -a $L
cp /tmp/qa/summary.json $OUT/quickstart-auto-summary.json
zcat -f /tmp/qa/seed-0/pfedlia-p2p/n0*.jsonl* | grep "\"start\"" | head -3 | cut -c1-300 | tee -a $L
step quickstart pfedlia-p2p sampling 8 of 19, device auto, seed 0
timeout 80 $P run scenarios/quickstart.toml --methods pfedlia-p2p --seeds 0-0 --set "train.device='auto'" --set methods.pfedlia-p2p.all_pairs_up_to=8 --set methods.pfedlia-p2p.sample=8 --out /tmp/qsm -q 2>&1 | tail -12 | tee -a $L
cp /tmp/qsm/summary.json $OUT/quickstart-sample-auto-summary.json
step cuda test
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/influence/test_lazy_influence.py 2>&1 | tail -4 | tee -a $L
step lia.py
for d in fmnist digits; do for dev in cuda cpu; do
  o=""; [ $d = digits ] && o="--only a"
  timeout 100 python3 benchmarks/lia.py --dataset $d $o --device $dev --repeat 5 --json $OUT/lia-$d-$dev.json 2>&1 | tee -a $L
done; done
step quickstart pfedlia-p2p, device cpu, seeds 0-2
timeout 100 $P run scenarios/quickstart.toml --methods pfedlia-p2p --seeds 0-2 --set "train.device='cpu'" --out /tmp/qc -q 2>&1 | tail -12 | tee -a $L
cp /tmp/qc/summary.json $OUT/quickstart-cpu-summary.json
step end
