#!/bin/bash
mkdir -p /logs/verifier
if grep -qx 'port = 9090' /app/config.ini && grep -qx 'host = localhost' /app/config.ini && grep -qx 'workers = 4' /app/config.ini && [ $(wc -l < /app/config.ini) -eq 4 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
