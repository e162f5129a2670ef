"""One way to build a Kubernetes API client, shared by every part of the agent that talks to
the API server: --kubeconfig when given, else in-cluster config (the DaemonSet), else
$KUBECONFIG / ~/.kube/config (a developer's machine). lightkube's default timeouts (10 s)
suit requests.

Watches are another matter: lightkube reads a watch with no read timeout at all and has no
way to ask for bookmarks, so a connection that goes quiet without closing (a half-open TCP
connection, a wedged proxy or load balancer) blocks its reader forever while every earlier
answer looks current. `watch_once` makes one watch request the way client-go's reflector
does: bookmarks asked for, a server-side `timeoutSeconds`, and a client read timeout longer
than the gap between bookmarks, so silence becomes an exception the caller can act on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# Connecting, writing and waiting for a pool slot: as for any request.
CONNECT_TIMEOUT = 10.0


class WatchSilent(Exception):
    """No byte arrived on a watch within its read timeout: the connection is presumed dead."""


def make_client(kubeconfig: Path | None = None) -> Any:
    from lightkube import Client, KubeConfig

    if kubeconfig is not None:
        return Client(config=KubeConfig.from_file(kubeconfig))
    return Client()


def watch_once(
    client: Any,
    resource: type[Any],
    *,
    namespace: str | None = None,
    fields: Mapping[str, str] | None = None,
    resource_version: str | None,
    server_timeout: int,
    read_timeout: float,
) -> Iterator[tuple[str, Any]]:
    """The events of one watch request, `(type, object)` with type ADDED, MODIFIED, DELETED or
    BOOKMARK (an object that carries only `metadata.resourceVersion`), until the server ends
    the stream (after `server_timeout` seconds, or earlier).

    Raises `WatchSilent` when nothing arrives for `read_timeout` seconds, lightkube's
    `ApiError` for an error status or an ERROR event (410 Gone: relist), and httpx's errors
    for a broken connection. The connection is closed whichever way the iteration ends.

    Built from the pieces of lightkube's own `Client.watch` (its request preparation, event
    decoding and error mapping), which offer neither bookmarks nor a read timeout.
    """
    import httpx2
    from lightkube.core.generic_client import WatchDriver
    from lightkube.core.selector import build_selector

    generic = client._client  # lightkube's GenericSyncClient
    request_spec = generic.prepare_request(
        "list",
        res=resource,
        namespace=namespace,
        watch=True,
        params={
            "allowWatchBookmarks": "true",
            "timeoutSeconds": server_timeout,
            "resourceVersion": resource_version,
            "fieldSelector": build_selector(dict(fields), for_fields=True) if fields else None,
        },
    )
    driver: Any = WatchDriver(request_spec, generic._client.build_request)  # untyped
    timeout = httpx2.Timeout(CONNECT_TIMEOUT, read=read_timeout)
    response = generic.send(driver.get_request(timeout=timeout), stream=True)
    try:
        if response.is_error:
            response.read()
            generic.raise_for_status(response)  # lightkube's ApiError, with the Status
        for line in response.iter_lines():
            if line:
                yield driver.process_one_line(line)
    except httpx2.ReadTimeout:
        raise WatchSilent(f"no data on the watch for {read_timeout:g}s") from None
    finally:
        response.close()
