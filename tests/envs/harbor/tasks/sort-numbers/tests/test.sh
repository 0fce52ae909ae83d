#!/bin/bash
mkdir -p /logs/verifier
if sort -n /app/numbers.txt | cmp -s - /app/sorted.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
