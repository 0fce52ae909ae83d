#!/bin/bash
mkdir -p /logs/verifier
if [ -x /app/bin/hello ] && [ "$(/app/bin/hello)" = "hello world" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
