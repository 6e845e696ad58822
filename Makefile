# The two commands of the README. Both install what is missing first (scripts/setup.sh is idempotent).
.PHONY: app test setup

setup:
	bash scripts/setup.sh

app: setup
	.venv/bin/streamlit run app.py

test: setup
	.venv/bin/python -m pytest -q
