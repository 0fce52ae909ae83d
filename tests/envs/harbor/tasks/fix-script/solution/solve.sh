#!/bin/bash
sed -i "s/\$1 - \$2/\$1 + \$2/" /app/sum.sh
