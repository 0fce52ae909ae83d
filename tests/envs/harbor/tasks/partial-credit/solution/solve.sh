#!/bin/bash
cd /app
echo alpha > a.txt; echo beta > b.txt; echo gamma > c.txt; echo delta > d.txt
