"""Gunicorn's configuration for the console's web process (``make serve``, the systemd unit).

    gunicorn -c console/gunicorn_conf.py console.wsgi

Every value can be overridden from the environment (the variables below), which is how the
systemd unit's environment file tunes it per host.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

# Gunicorn executes this file by path; the repository must be importable for the logger class.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.gunicorn_logging import JsonAccessLogger

wsgi_app = "console.wsgi:application"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000").split(",")

# Sync workers: every request is short (the API never calls the payment provider; workers do),
# and a reverse proxy in front buffers slow clients. The usual 2 x CPUs + 1 keeps the CPUs busy
# while some workers wait on PostgreSQL.
workers = int(os.environ.get("WEB_CONCURRENCY") or multiprocessing.cpu_count() * 2 + 1)
worker_class = "sync"
# A request taking longer than this is a stuck worker: gunicorn kills and replaces it. Well
# above the slowest real request (a page of the admin), below a proxy's usual 60 s.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
# On SIGTERM (a deploy, systemctl stop) requests in flight get this long to finish.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# Replace each worker after about this many requests, so that a slow leak cannot grow without
# bound; the jitter keeps the workers from restarting all at once.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "2000"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "200"))
# The heartbeat file lives in memory where that exists: a worker blocked on a slow disk would
# otherwise be killed as stuck.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None  # noqa: S108
# Only the local reverse proxy may set X-Forwarded-* headers.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")

# Logs go to standard output and error, for journald (systemd) or the terminal (make serve).
accesslog = os.environ.get("GUNICORN_ACCESS_LOG", "-")
errorlog = os.environ.get("GUNICORN_ERROR_LOG", "-")
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
logger_class = JsonAccessLogger
proc_name = "effect-console-web"
# Gunicorn's control socket defaults to one path per user, which two instances on one host (web
# on two ports, a second checkout) would fight over. systemd reloads with HUP instead; set
# GUNICORN_CONTROL_SOCKET to a path of this instance's own to use gunicornc.
control_socket = os.environ.get("GUNICORN_CONTROL_SOCKET", "")
control_socket_disable = not control_socket
