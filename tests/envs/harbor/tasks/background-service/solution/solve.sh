#!/bin/bash
mkdir -p /srv/www && echo pong > /srv/www/status
busybox httpd -p 127.0.0.1:8080 -h /srv/www
