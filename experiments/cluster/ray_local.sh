#!/usr/bin/env bash
# A local Ray cluster (a head node on localhost and two worker nodes, one CPU each) and a sweep sent to it
# through Hydra's Ray launcher; the cluster is stopped afterwards, also on failure.
#
#   pip install -e '.[ray]'
#   experiments/cluster/ray_local.sh                                  # a 4-job demo sweep
#   experiments/cluster/ray_local.sh policy=mtp1,dspark traffic.num_users=4,64 duration_s=20
#
# Arguments replace the demo sweep's overrides. Environment: RAY_PORT (default 6390), SWEEP_DIR (default
# multirun/ray_local/<time>). The head node offers no CPU, so every job runs on a worker node, as it would
# on a real cluster; jobs find the checkout and environment by sharing this machine's file system.
set -euo pipefail
port="${RAY_PORT:-6390}"
sweep_dir="${SWEEP_DIR:-multirun/ray_local/$(date +%Y-%m-%d_%H-%M-%S)}"
if [ "$#" -eq 0 ]; then
    set -- policy=mtp1,dspark traffic.num_users=4,16 duration_s=5 warmup_s=1
fi
common=(--disable-usage-stats --include-dashboard=false)
stop() { ray stop --force >/dev/null 2>&1 || true; }
trap stop EXIT
ray start --head --port="$port" --num-cpus=0 "${common[@]}" >/dev/null
for _ in 1 2; do
    ray start --address="127.0.0.1:$port" --num-cpus=1 --disable-usage-stats >/dev/null
done
python - "$port" <<'PY'
import sys, time
import ray
ray.init(address=f"127.0.0.1:{sys.argv[1]}", logging_level="ERROR")
for _ in range(60):  # worker nodes register within seconds
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) == 3 and ray.cluster_resources().get("CPU", 0) >= 2:
        break
    time.sleep(1)
print(f"ray cluster: {len(alive)} nodes, {ray.cluster_resources().get('CPU', 0):g} CPUs")
PY
python -m experiments.run -m hydra/launcher=ray "hydra.launcher.ray.init.address=127.0.0.1:$port" \
    +hydra.launcher.ray.init.object_store_memory=null +hydra.launcher.ray.remote.num_cpus=1 \
    "hydra.sweep.dir=$sweep_dir" progress=false write_tables=false interval_jobs=1 "$@"
echo "summaries: $(ls "$sweep_dir"/*/summary.json | wc -l) in $sweep_dir"
