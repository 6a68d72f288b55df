#!/usr/bin/env python3
"""relay.py — a fault-injecting TCP relay between the multi-host test's hosts.

It runs in the router namespace of multihost.sh, where a netfilter rule
redirects every TCP connection one host opens to the other to this relay's
port. The relay finds where the connection was going (SO_ORIGINAL_DST),
opens its own connection there, and copies the bytes both ways, doing to
them what links and middleboxes do and tc cannot do on this kernel:

    latency  each chunk waits 2-8 ms (jitter; order kept)
    pieces   the first 64 KiB of each direction are written 1 byte at a
             time (every frame header and handshake message split)
    stall    each direction stops for 2 s once, half a second in
    reset    once, after 1 MiB has crossed the mesh's connections, the
             connection that carried them is reset (RST both ways)

usage: relay.py PORT MODE STORE_PORT   (the store's own connection is never reset)
"""
import asyncio
import random
import socket
import struct
import sys
import time

SO_ORIGINAL_DST = 80
PIECES_BYTES = 64 * 1024
RESET_AFTER = 1024 * 1024


class Faults:
    def __init__(self, mode, store_port):
        self.mode = mode
        self.store_port = store_port
        self.crossed = 0
        self.reset_done = False


def original_destination(sock):
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntoa(raw[4:8]), port


def hard_close(*writers):
    """Close with SO_LINGER 0: the peers get an RST, not a FIN."""
    for w in writers:
        s = w.get_extra_info("socket")
        try:
            if s is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass  # already closed
        w.transport.abort()


async def pump(reader, writer, other, faults, is_mesh):
    started = time.monotonic()
    sent = 0
    stalled = False
    while True:
        data = await reader.read(65536)
        if not data:
            break
        if faults.mode == "latency":
            await asyncio.sleep(0.002 + 0.006 * random.random())
        elif faults.mode == "stall" and not stalled and time.monotonic() - started > 0.5:
            stalled = True
            await asyncio.sleep(2.0)
        elif faults.mode == "reset" and is_mesh and not faults.reset_done:
            faults.crossed += len(data)
            if faults.crossed > RESET_AFTER:
                faults.reset_done = True
                print(f"relay: reset a connection after {faults.crossed} B", flush=True)
                hard_close(writer, other)
                return
        if faults.mode == "pieces" and sent < PIECES_BYTES:
            head, data = data[:PIECES_BYTES - sent], data[PIECES_BYTES - sent:]
            for i in range(len(head)):
                writer.write(head[i:i + 1])
                await writer.drain()
            sent += len(head)
        if data:
            writer.write(data)
            await writer.drain()
    try:
        writer.write_eof()
    except (OSError, RuntimeError):
        pass


async def handle(reader, writer, faults):
    host, port = original_destination(writer.get_extra_info("socket"))
    try:
        r2, w2 = await asyncio.open_connection(host, port)
    except OSError:
        hard_close(writer)
        return
    for w in (writer, w2):
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    is_mesh = port != faults.store_port
    print(f"relay: to {host}:{port}{'' if is_mesh else ' (the store)'}", flush=True)
    try:
        await asyncio.gather(pump(reader, w2, writer, faults, is_mesh),
                             pump(r2, writer, w2, faults, is_mesh))
    except (ConnectionError, OSError):
        hard_close(writer, w2)
    finally:
        writer.close()
        w2.close()


async def main():
    port, mode, store_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    faults = Faults(mode, store_port)
    server = await asyncio.start_server(lambda r, w: handle(r, w, faults), "0.0.0.0", port)
    print(f"relay: {mode} on port {port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
