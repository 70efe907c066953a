"""nginx as a TLS reverse proxy in front of the pacer: its binary, a free port, its config."""

from __future__ import annotations

import os
import shutil


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (
            p
            for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
            if os.access(p, os.X_OK)
        ),
        None,
    )


NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
{user}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream pacer {{
        server 127.0.0.1:{upstream};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
        location / {{
            proxy_pass http://pacer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""
