#!/bin/bash
mkdir -p /logs/verifier
if [ "$(busybox wget -qO- http://127.0.0.1:8080/status)" = pong ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
