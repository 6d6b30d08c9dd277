# Every target does its own set-up first (scripts/setup.sh is idempotent and quick once done).
PYTHON ?= python3

.PHONY: setup test demo validate

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

test: setup
	$(PYTHON) -m pytest -q

demo: setup
	$(PYTHON) train.py --config configs/tiny.yaml

validate: setup
	$(PYTHON) env.py validate tasks/
