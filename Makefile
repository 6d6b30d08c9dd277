# Every target does its own set-up first (scripts/setup.sh is idempotent and quick once done).
PYTHON ?= python3

.PHONY: setup test demo demo-smollm2 validate

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

test: setup
	$(PYTHON) -m pytest -q

demo: setup
	$(PYTHON) train.py --config configs/tiny.yaml

# the real pretrained model (README "A real model on CPU"): longer than `make demo`, and it learns more
demo-smollm2: setup
	$(PYTHON) scripts/get_smollm2.py
	$(PYTHON) train.py --config configs/smollm2-cpu.yaml

validate: setup
	$(PYTHON) tasktool.py validate tasks/
