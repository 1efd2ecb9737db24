#!/usr/bin/env bash
# Fill .whl/ with what the GPU machine lacks, for its Python (3.12, x86-64), at the versions this venv
# tests with. Run where PyPI is reachable, from the repository root: bash benchmarks/gpu/wheels.sh
# deepspeed ships only an sdist: it is built here into a wheel with its ops off (they JIT-build on use).
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
# Missing on the GPU image (benchmarks/gpu/README.md lists why each is needed); not wandb: the suite logs none.
packages=(deepspeed hjson diffusers importlib_metadata av pydantic pydantic_core annotated_types
  typing_inspection snac soundfile cffi pycparser datasets dill multiprocess)
mkdir -p .whl
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
for name in "${packages[@]}"; do
  version=$("$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  if [ "$name" = deepspeed ]; then
    DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$version"
  else
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .whl "$name==$version"
  fi
done
du -sh .whl
