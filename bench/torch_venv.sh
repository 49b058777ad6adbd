#!/bin/sh
# bench/torch_venv.sh [DIR]: a Python venv (default DIR: .venv-torch) with
# PyPI's newest torch and torchvision, for bench/nn_step.sh (TORCH_VENV=DIR)
# beside Debian's older python3-torch. PyPI's torch wheel is built for CUDA
# and imports its CUDA libraries even on a machine without a GPU, so the
# nvidia-* wheels it names are installed too, without their own
# dependencies (nothing else of CUDA is needed for CPU runs). About 3 GB.
set -eu
dir=${1:-.venv-torch}
py=${PYTHON:-python3}
"$py" -m venv "$dir"
pip="$dir/bin/pip"
"$pip" install --no-deps torch torchvision
"$pip" install typing-extensions filelock fsspec jinja2 networkx sympy numpy \
    pillow setuptools
nv=$("$pip" show torch | sed -n 's/^Requires: //p' | tr ',' '\n' |
     sed -n 's/^ *\(nvidia-[^ ]*\).*/\1/p')
# shellcheck disable=SC2086
"$pip" install --no-deps $nv nvidia-cufile
"$dir/bin/python" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
