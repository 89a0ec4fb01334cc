#!/usr/bin/env bash
# The Python wheel's GPU backend on the GPU machine: python/tests/test_gpu.py (every function
# family, 'gpu' == 'cpu', with the GPU's batch counters) against the wheel as a user installs
# it, next to the datafusion 55 wheel from PyPI.
# Here first: scripts/gpu/python-wheel.sh pack (maturin's dev-profile wheel, its library
# stripped and compressed, with the datafusion wheel and its pure-Python dependencies; the
# machine has no internet); then through the device tool: command
# `bash scripts/gpu/python-wheel.sh run`, carry ["carry/python"].
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/python
case "${1:-}" in
pack)
    venv=${VENV:-$HOME/.cache/datafusion-sets/py-venv}
    rm -rf "$carry" python/dist && mkdir -p "$carry/wheels"
    (cd python && "$venv/bin/maturin" build --profile dev --locked --out dist)
    "$venv/bin/pip" download --quiet --no-deps -d "$carry/wheels" "datafusion==55.*" \
        "cloudpickle>=2" "typing-extensions>=4.12"
    # The wheels' libraries go compressed with xz (a wheel is a zip: too large to carry).
    site=$carry/site && mkdir -p "$site"
    for w in python/dist/*.whl "$carry"/wheels/datafusion-*.whl; do
        python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$site"
    done
    rm "$carry"/wheels/datafusion-*.whl
    find "$site" -name "*.so" | while read -r so; do
        strip "$so" && xz -T0 -6 -f "$so"
    done
    cp python/tests/test_gpu.py "$carry/"
    du -sh "$carry"
    ;;
run)
    site=/tmp/dfsets-python/site
    rm -rf /tmp/dfsets-python && mkdir -p "$site"
    cp -r "$carry/site/." "$site/"
    find "$site" -name "*.so.xz" | while read -r so; do
        python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$so" "${so%.xz}"
        rm "$so"
    done
    for w in "$carry"/wheels/*.whl; do
        python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$site"
    done
    python3 --version
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    PYTHONPATH=$site python3 -c "import datafusion, datafusion_sets as d; print('datafusion', datafusion.__version__, 'gpu_available', d.gpu_available())"
    cd /tmp/dfsets-python && PYTHONPATH=$site python3 "$OLDPWD/$carry/test_gpu.py"
    ;;
*)
    echo "usage: $0 pack | run" >&2
    exit 2
    ;;
esac
