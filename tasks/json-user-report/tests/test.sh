#!/bin/bash
# Verifier: run the hidden tests, then write the reward the harness reads.
mkdir -p /logs/verifier
python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
