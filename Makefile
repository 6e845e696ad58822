# The two commands of the README. Both install what is missing first (scripts/setup.sh is idempotent).
.PHONY: app test setup demo-adapters

setup:
	bash scripts/setup.sh

app: setup
	.venv/bin/python app.py

test: setup
	.venv/bin/python -m pytest -q -n 2 --dist loadfile  # two workers, a test file each (tests/conftest.py)

# Retrain the shipped demo adapters (examples/adapters) into a temp dir and compare them bit for bit (~1.5 h on 2 cores).
demo-adapters: setup
	.venv/bin/python scripts/demo_adapters.py
