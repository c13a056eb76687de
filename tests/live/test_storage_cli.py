"""The real `backend.ai` CLI's vfolder commands and `--mount` against the running system."""

import pytest

from identity_app.keypairs import main_keypair
from scheduling_app.models import ScalingGroup
from sessions_app.models import Session, Status
from storage_app.models import Mount
from tests.support import IMAGE, wait_for

pytestmark = pytest.mark.docker


def test_vfolder_commands_and_a_mount_from_the_cli(backendai, alice, tmp_path):
    ScalingGroup.objects.filter(name="default").update(storage_root=str(tmp_path / "storage"))
    keypair = main_keypair(alice)
    code, out = backendai(keypair, "vfolder", "create", "vf1", "default")
    assert code == 0 and 'Virtual folder "vf1" is created' in out, out
    code, out = backendai(keypair, "vfolder", "mkdir", "vf1", "inside")
    assert code == 0, out
    code, out = backendai(keypair, "vfolder", "ls", "vf1", ".")
    assert code == 0 and "inside" in out, out
    code, out = backendai(keypair, "vfolder", "info", "vf1")
    assert code == 0 and "Number of files: 1" in out, out
    code, out = backendai(keypair, "session", "create", "-t", "interactive", "--name", "cli-vf",
                          "-r", "cpu=0.5", "-r", "mem=128m", "-m", "vf1", IMAGE)
    assert code == 0, out
    session = Session.objects.get(name="cli-vf")
    assert Mount.objects.get(session=session).path == "/home/work/vf1"
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.RUNNING, timeout=90,
             message="cli-vf RUNNING")
    code, out = backendai(keypair, "vfolder", "delete", "vf1")
    assert "cli-vf" in out, out  # refused while the session mounts it
    code, out = backendai(keypair, "session", "destroy", "cli-vf")
    assert code == 0, out
    wait_for(lambda: Session.objects.get(pk=session.pk).status == Status.TERMINATED,
             timeout=90, message="cli-vf TERMINATED")
    code, out = backendai(keypair, "vfolder", "delete", "vf1")
    assert code == 0 and not Mount.objects.filter(folder__name="vf1").exists(), out
