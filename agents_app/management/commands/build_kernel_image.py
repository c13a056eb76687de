import io
import shutil
import struct
import tarfile

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from docker.errors import BuildError, DockerException

from agents_app.runtime import docker_backend, images

# Backend.AI's standard image labels: a kernel image (kernelspec), its base (a static
# busybox, no C library to match), how query-mode code runs (the shell: an "app" image with
# no language runtime of its own), and the least a kernel of it needs (a shell and its
# tools: a tenth of a core, 16 MiB). No maximum: nothing in it limits how much a kernel uses.
LABELS = b"""LABEL ai.backend.kernelspec="1" \\
      ai.backend.base-distro="static-gnu" \\
      ai.backend.runtime-type="app" \\
      ai.backend.runtime-path="/bin/sh" \\
      ai.backend.resource.min.cpu="0.1" \\
      ai.backend.resource.min.mem="16m"
"""
DOCKERFILE_STATIC = b"""FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
""" + LABELS + b"""CMD ["/bin/sh"]
"""
DOCKERFILE_HUB = b"""FROM busybox:latest
""" + LABELS


def build_context(busybox_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        dockerfile = DOCKERFILE_STATIC if busybox_path else DOCKERFILE_HUB
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        if busybox_path:
            tar.add(busybox_path, arcname="busybox")
    buffer.seek(0)
    return buffer


def static_busybox():
    for path in ("/bin/busybox", shutil.which("busybox") or ""):
        if path and _is_static(path):
            return path
    return None


def _is_static(path):
    """True for an ELF executable without a program interpreter (PT_INTERP)."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit ELF only
            return False
        order = "<" if header[5] == 1 else ">"
        (phoff,) = struct.unpack_from(order + "Q", header, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    pt_interp = 3
    return all(struct.unpack_from(order + "I", table, i * phentsize)[0] != pt_interp
               for i in range(phnum))


class Command(BaseCommand):
    help = "Build the default kernel image (a static busybox FROM scratch) if it is missing."

    def add_arguments(self, parser):
        parser.add_argument("--tag", default=settings.DEFAULT_KERNEL_IMAGE)
        parser.add_argument("--force", action="store_true")

    def handle(self, *args, tag, force, **options):
        try:
            client = docker_backend.connect()
        except DockerException as exc:
            self.stdout.write(self.style.WARNING(
                f"Docker engine unreachable ({exc}); not building {tag}. The web UI still runs; "
                "sessions stay PENDING until an agent can reach Docker."))
            return
        if not force and images.image_exists(client, tag):
            self.stdout.write(f"kernel image {tag} present")
            return
        busybox = static_busybox()
        source = busybox or "busybox:latest from Docker Hub"
        self.stdout.write(f"building kernel image {tag} from {source}")
        try:
            client.images.build(fileobj=build_context(busybox), custom_context=True, tag=tag,
                                rm=True)
        except (BuildError, DockerException) as exc:
            raise CommandError(f"could not build {tag}: {exc}. Install Debian's busybox-static "
                               "(apt-get install busybox-static) and try again.") from None
        self.stdout.write(self.style.SUCCESS(f"built {tag}"))
