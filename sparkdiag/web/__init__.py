"""The HTTP server: ``/metrics`` and the landing page, TLS and basic auth from an exporter-toolkit
web configuration file, connection limits and timeouts. It serves what :mod:`sparkdiag.exporter`
renders.

asyncio is imported here without ``ssl``: asyncio's modules import ``ssl`` for their own TLS
transports (``loop.create_server(ssl=...)``), which sparkdiag does not use (its TLS is
:mod:`sparkdiag.web.tls`, ``ssl.SSLObject`` on memory buffers); OpenSSL then stays out of a
daemon that serves plain HTTP, some 5 MiB of its resident memory. ``ssl`` itself imports as
usual afterwards (for a TLS web config, a peer over https); only asyncio's own TLS transports
are off in this process. Where asyncio is imported already, or an asyncio cannot do without
``ssl``, it is imported as usual."""

import sys


def _asyncio_without_ssl() -> None:
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` raises ImportError
    try:
        import asyncio  # noqa: F401
    except ImportError:  # an asyncio that needs ssl: forget the half-imported one
        for name in [n for n in sys.modules if n == "asyncio" or n.startswith("asyncio.")]:
            del sys.modules[name]
    finally:
        if "ssl" in sys.modules and sys.modules["ssl"] is None:
            del sys.modules["ssl"]


_asyncio_without_ssl()
