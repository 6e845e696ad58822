# The two commands of the README. Both install what is missing first (scripts/setup.sh is idempotent).
.PHONY: app test check serve setup demo-adapters

setup:
	bash scripts/setup.sh

app: setup
	.venv/bin/python app.py

# two workers, a test file each, the slowest files first (tests/conftest.py: SLOW_FILES): --no-loadscope-reorder keeps
# that order (pytest-xdist otherwise hands out the files with the most tests first, whatever their time)
test: setup
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The inner loop, under 2 minutes on 2 cores: ruff as tests/test_lint.py runs it, the layering rule
# (tests/test_architecture.py) and the test files that take seconds, not minutes (FAST_TESTS: chosen from the full
# suite's durations; docs/reliability.md, "The inner loop"). `make test` is still the whole check.
CODE = topl_core pages scripts tests app.py
FAST_TESTS = $(addprefix tests/test_,$(addsuffix .py,aot_packages architecture adapters cliff config_fields control_vector \
	data_fuzz decode_precision docs encode evaluation fava fluency halueval kv_cache label_settings methods mlqe models \
	own_summaries perturb progress records token_scores transfer translation))

check: setup
	.venv/bin/python -m ruff check --output-format concise $(CODE)
	.venv/bin/python -m ruff format --check $(CODE)
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=5 $(FAST_TESTS)

# The OpenAI-compatible service on the demo TOPL adapter, on loopback (docs/serve.md; `serve --help` for the rest).
serve: setup
	.venv/bin/python -m topl_core serve --run examples/adapters/topl-smollm2

# Retrain the shipped demo adapters (examples/adapters) into a temp dir and compare them bit for bit (~1.5 h on 2 cores).
demo-adapters: setup
	.venv/bin/python scripts/demo_adapters.py
