"""How every kvcal command finds its API server: one order, each caller choosing which steps apply.

1. ``kubeconfig``, a file named on the command line: that file or an error (never silently another cluster).
2. With ``home``: the client's default file, $KUBECONFIG, else ~/.kube/config (`kvcal status`, `promotion-patch`).
3. With ``in_cluster``: the pod's ServiceAccount (the operator; `kvcal` commands run in a pod).

A kubeconfig's current context names the default namespace; in-cluster it is "default".
"""

from dataclasses import dataclass

from kubernetes import client, config


@dataclass(frozen=True)
class Connection:
    api_client: client.ApiClient
    namespace: str  # the kubeconfig context's namespace, else "default"


def _from_file(path: str | None) -> Connection:
    api_client = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
    _, context = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    return Connection(api_client, context.get("context", {}).get("namespace") or "default")


def connect(kubeconfig: str | None = None, *, home: bool = True, in_cluster: bool = True) -> Connection:
    """The first source in the module's order that loads; raises config.ConfigException naming why none did."""
    if kubeconfig:
        return _from_file(kubeconfig)
    file_error: config.ConfigException | None = None
    if home:
        try:
            return _from_file(None)
        except config.ConfigException as e:
            if not in_cluster:
                raise
            file_error = e
    if not in_cluster:
        raise config.ConfigException("no kubeconfig named and none to look for")
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException as e:
        raise config.ConfigException(str(file_error or e)) from None
    return Connection(client.ApiClient(), "default")
