#!/bin/bash
sleep 60
echo done > /app/done.txt
