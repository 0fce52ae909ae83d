#!/bin/bash
echo $((42 * 42)) > /app/answer.txt
