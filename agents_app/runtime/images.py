"""The agent's images: whether one is here, pulls with their progress, the kernel images
it offers in its heartbeat, and `docker commit` of a kernel's container."""

import contextlib
import json
import time

import docker
from docker.errors import APIError, DockerException, ImageNotFound

from agents_app.runtime.docker_backend import KEPT_IMAGE_REPOSITORY, KERNELSPEC


def image_exists(client, image):
    try:
        client.images.get(image)
        return True
    except ImageNotFound:
        return False


def pull_image(client, image, progress=None):
    """Pull `image`, calling progress(dict) now and then; raises APIError on failure.

    Never interrupted: a killed pull can wedge the Docker daemon for every container.
    """
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = image, "latest"
    layers, last_report = {}, 0.0
    for line in client.api.pull(repository, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise APIError(line["error"])
        if "id" in line and line.get("status"):
            layers[line["id"]] = line
        now = time.monotonic()
        if progress and now - last_report > 0.5:
            last_report = now
            progress(_pull_progress(layers))
    if progress:
        progress(_pull_progress(layers))


def _pull_progress(layers):
    done = sum(1 for v in layers.values() if v["status"] in ("Pull complete", "Already exists"))
    current = sum(v.get("progressDetail", {}).get("current", 0) for v in layers.values())
    total = sum(v.get("progressDetail", {}).get("total", 0) for v in layers.values())
    return {"layers_done": done, "layers_total": len(layers), "bytes_current": current,
            "bytes_total": total}


COMMIT_TIMEOUT = 3600  # seconds Docker may take to commit a container's writable layer


def writable_size(client, container_id):
    """Bytes of the container's writable layer (what a commit stores), or None."""
    with contextlib.suppress(DockerException, OSError, KeyError, IndexError):
        return client.api.containers(all=True, filters={"id": container_id},
                                     size=True)[0].get("SizeRw")
    return None


def commit_container(container, image, labels):
    """`docker commit` of a kernel's container as `image` (repository:tag): its writable
    layer over its image, with the image's own configuration. The labels and environment
    variables the agent gave the kernel are blanked, as the commit would otherwise hand
    them to every kernel of the new image that does not set them itself (the old kernel's
    scratch volume, network, pre-stop hook, mounts, the user's variables); the image's
    command is put back; `labels` are added. The new image."""
    client = docker.from_env(timeout=COMMIT_TIMEOUT)
    try:
        base = client.images.get(container.attrs["Image"]).attrs.get("Config") or {}
        own = container.attrs.get("Config") or {}
        base_labels = base.get("Labels") or {}
        base_env = {entry.partition("=")[0] for entry in base.get("Env") or []}
        changes = [f"LABEL {json.dumps(key)}=\"\"" for key in sorted(own.get("Labels") or {})
                   if key not in base_labels and key not in labels]
        # Never one an engine may put there itself (an empty PATH would break the image).
        changes += [f'ENV {name}=""' for name in sorted(
            {entry.partition("=")[0] for entry in own.get("Env") or []} - base_env
            - {"PATH", "HOME", "HOSTNAME", "TERM"})]
        changes += [f"LABEL {json.dumps(key)}={json.dumps(value)}"
                    for key, value in sorted(labels.items())]
        if base.get("Cmd"):
            changes.append(f"CMD {json.dumps(base['Cmd'])}")
        repository, _, tag = image.rpartition(":")
        image_id = client.api.commit(container.id, repository=repository, tag=tag,
                                     changes=changes)["Id"]
        return client.images.get(image_id)
    finally:
        client.close()


def kernelspec_images(client):
    """The kernel images here, from Docker's image list alone: one request (the SDK's
    `images.list()` inspects every image after it, a request each, every heartbeat)."""
    images = []
    for summary in client.api.images(filters={"label": KERNELSPEC}):
        for tag in summary.get("RepoTags") or []:
            if tag != "<none>:<none>" and not tag.startswith(KEPT_IMAGE_REPOSITORY):
                images.append({"name": tag, "labels": summary.get("Labels") or {}})
    return images
