#!/bin/bash
mkdir -p /logs/verifier
echo great > /logs/verifier/reward.txt
