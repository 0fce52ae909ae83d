#!/bin/bash
echo '{"name": "gymflow", "count": 3}' > /app/out.json
