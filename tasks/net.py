"""Local ports: one free port to bind a server to, and whether a port already has a listener.

Usage:

    from tasks.net import free_port, port_busy
    port = free_port()          # the kernel's pick; bind it soon (another process may take it meanwhile)
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) == 0
