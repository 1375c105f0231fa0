"""TLS in the gateway itself (--certfile/--keyfile): a wss:// session with a certificate the
client trusts; a plain ws:// client gets no session."""
from __future__ import annotations

import asyncio
import json
import ssl
import subprocess

import pytest
from websockets.asyncio.client import connect as ws_connect

from gateway_settings import API_KEY

from gateway_process import GatewayProcess

pytestmark = pytest.mark.server


def _certificate(folder) -> tuple[str, str]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def test_wss_session(server, tmp_path):
    cert, key = _certificate(tmp_path)
    trust = ssl.create_default_context(cafile=cert)
    gateway = GatewayProcess(server.grpc_url, tmp_path, ["--certfile", cert, "--keyfile", key], tls=trust)

    async def session() -> list[str]:
        async with ws_connect(f"{gateway.ws_url}/v1/realtime?mode=audio&model=m", ssl=trust,
                              subprotocols=["map.realtime"],
                              additional_headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
            kinds = [json.loads(await ws.recv())["type"]]
            await ws.send(json.dumps({"type": "session.init", "payload": {}}))
            kinds.append(json.loads(await ws.recv())["type"])
            await ws.send(json.dumps({"type": "session.close"}))
            kinds += [json.loads(message)["type"] async for message in ws]
        return kinds

    async def plain() -> None:
        async with ws_connect(gateway.ws_url.replace("wss:", "ws:") + "/v1/realtime", open_timeout=5):
            pass

    try:
        kinds = asyncio.run(asyncio.wait_for(session(), 60))
        with pytest.raises(Exception):
            asyncio.run(plain())
    finally:
        assert gateway.stop() == 0
    assert kinds[:2] == ["session.queue_done", "session.created"] and kinds[-1] == "session.closed"
