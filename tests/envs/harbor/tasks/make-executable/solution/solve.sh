#!/bin/bash
mkdir -p /app/bin
printf "#!/bin/sh\necho hello world\n" > /app/bin/hello
chmod +x /app/bin/hello
