#!/usr/bin/env bash
# The GPU suite: bash benchmarks/gpu/run.sh [--smoke] [--only STEP,...] [--out DIR] [--write docs/benchmarks.md]
# On the GPU machine it first installs the wheels carried in .whl/ that the machine lacks (make them with
# benchmarks/gpu/wheels.sh where PyPI is reachable), then runs every step under its own time limit
# (benchmarks/gpu/suite.py). --smoke: tiny sizes on a CPU, as CI runs it.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
if [ -d .whl ]; then
  site=${FRAMER_DS_WHEEL_SITE:-/tmp/framer_ds_site}
  "$python" benchmarks/gpu/install_wheels.py .whl "$site"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" benchmarks/gpu/suite.py "$@"
