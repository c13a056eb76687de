"""The pure parts of a kernel's start (agents_app/runtime): the SSH client configuration of a
cluster, the init's words for a command it cannot execute, the step a failure names."""

import io
import tarfile

from agents_app.runtime import docker_backend as backend
from agents_app.runtime import errors, services
from agents_app.runtime.provisioners import ssh_archive
from agents_app.runtime.runner import ProvisionFailed

KEYPAIR = {"private": "PRIVATE\n", "public": "ssh-ed25519 AAAA backendai-cluster\n"}


def files_of(archive):
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: (tar.extractfile(m).read().decode() if m.isfile() else None, m.mode)
                for m in tar.getmembers()}


def test_a_cluster_kernel_gets_the_key_and_a_client_configuration_naming_every_host():
    files = files_of(ssh_archive(KEYPAIR, ["main1", "sub1", "sub2"]))
    assert files["home/work/.ssh/id_cluster"] == ("PRIVATE\n", 0o600)
    assert files["home/work/.ssh/authorized_keys"][0] == KEYPAIR["public"]
    config, mode = files["etc/ssh/ssh_config.d/backendai-cluster.conf"]
    assert mode == 0o644
    lines = [line.strip() for line in config.splitlines()]
    assert "Host main1 sub1 sub2" in lines
    assert {"Port 2200", "IdentityFile /home/work/.ssh/id_cluster", "BatchMode yes",
            "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"} <= set(lines)


def test_without_hosts_only_the_key_goes_in():
    assert not any(name.startswith("etc/") for name in files_of(ssh_archive(KEYPAIR)))


def test_the_inits_words_for_a_command_it_cannot_execute_are_found_in_a_log():
    log = "[FATAL tini (7)] exec nosuchcmd failed: No such file or directory\n"
    assert backend.INIT_EXEC_FAILED.search(log).group(1) == (
        "exec nosuchcmd failed: No such file or directory")
    assert backend.INIT_EXEC_FAILED.search("sh: nosuchcmd: not found\n") is None


def test_a_failure_names_its_step_and_keeps_the_kind_of_its_cause():
    failed = ProvisionFailed("folder-mounts", errors.AgentCannotRun(
        "storage folder 'data' is not on this host (/x: No such file or directory)"))
    assert str(failed) == ("folder-mounts: storage folder 'data' is not on this host "
                           "(/x: No such file or directory)")
    assert (failed.provisioner, failed.kind) == ("folder-mounts", errors.AGENT)
    assert ProvisionFailed("readiness", services.NotReady("web did not answer")).kind == \
        errors.TRANSIENT
