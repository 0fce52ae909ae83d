#!/usr/bin/env bash
# Start a Docker daemon for the Docker Engine test pass (.ci/run) when none answers; exit 0 once one does.
# Its log goes to /var/tmp/gymflow-dockerd.log. A machine whose daemon already runs (systemd) is left alone.
set -uo pipefail
answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
answers && exit 0
command -v dockerd >/dev/null 2>&1 || { echo "dockerd is not installed (apt-get install docker.io)" >&2; exit 1; }
setsid nohup dockerd >/var/tmp/gymflow-dockerd.log 2>&1 < /dev/null &
for _ in $(seq 120); do
  answers && exit 0
  sleep 0.5
done
echo "dockerd did not answer within 60 s; its log:" >&2
tail -n 20 /var/tmp/gymflow-dockerd.log >&2
exit 1
