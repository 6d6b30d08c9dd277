# Every target does its own set-up first (scripts/setup.sh is idempotent and quick once done).
PYTHON ?= python3

.PHONY: setup test demo demo-tiny validate

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

test: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q

# the real pretrained model (README "A real model on CPU"); the fetch does nothing once done
demo: setup
	$(PYTHON) scripts/get_smollm2.py
	$(PYTHON) train.py --config configs/smollm2-cpu.yaml

# the 0.8M-parameter model built from scratch: what the tests train, in about as long
demo-tiny: setup
	$(PYTHON) train.py --config configs/tiny.yaml

validate: setup
	$(PYTHON) tasktool.py validate tasks/
