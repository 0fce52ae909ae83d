#!/bin/bash
sort -n /app/numbers.txt > /app/sorted.txt
