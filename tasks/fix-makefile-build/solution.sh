#!/bin/bash
cd /app
cat > /app/Makefile <<'MK'
# Build per-student score sums and a combined report.
#   make          -> build/report.txt
#   make clean    -> remove build/
SOURCES := $(sort $(wildcard src/*.csv))
SUMS := $(patsubst src/%.csv,build/%.sum,$(SOURCES))

.PHONY: all clean

all: build/report.txt

build:
	mkdir -p build

build/%.sum: src/%.csv | build
	awk -F, '{ s += $$2 } END { print s + 0 }' $< > $@

build/report.txt: $(SUMS) | build
	for f in $(SUMS); do echo "$$(basename $$f .sum) $$(cat $$f)"; done > $@

clean:
	rm -rf build
MK
make
cat build/report.txt
