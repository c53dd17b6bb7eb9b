# Sourced by the GPU scripts: the peers' wheels (ci/gpu_stage.sh) joined from what earlier calls left
# under /tmp/mixbench_whl and from .whl when present (ci/wheels.py join), installed into
# /tmp/mixbench_site and put on PYTHONPATH. Nothing to do when neither is there; an incomplete set is
# reported (the peers that need the missing wheels then record their import errors).
# Usage: source ci/gpu_wheels.sh LOG
_whl_log=${1:-/dev/null}
_whl_src=()
[ -d /tmp/mixbench_whl ] && _whl_src+=(/tmp/mixbench_whl)
[ -d .whl ] && _whl_src+=(.whl)
if [ ${#_whl_src[@]} -gt 0 ]; then
  rm -rf /tmp/mixbench_wheels
  python3 ci/wheels.py join "${_whl_src[@]}" --to /tmp/mixbench_wheels > "$_whl_log" 2>&1 \
    || { echo "wheels: $(tail -1 "$_whl_log")"; }
  if compgen -G "/tmp/mixbench_wheels/*.whl" > /dev/null; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
         --target /tmp/mixbench_site /tmp/mixbench_wheels/*.whl >> "$_whl_log" 2>&1; then
      export PYTHONPATH=/tmp/mixbench_site${PYTHONPATH:+:$PYTHONPATH}
      echo "wheels: installed $(ls /tmp/mixbench_wheels | tr '\n' ' ')"
    else
      echo "wheels: pip install failed: $(tail -3 "$_whl_log")"
    fi
  fi
fi
unset _whl_src _whl_log
